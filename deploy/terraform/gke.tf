# GKE Standard cluster with Workload Identity, the GCS FUSE CSI driver and the Ray operator add-on
# (KubeRay managed by GKE), one CPU pool for the Ray head and autoresume, one TPU pool per slice.
#
# Locked down (deploy/README.md, "Security"): private nodes (no public IPs) on a subnet with
# Private Google Access, the control plane reachable only from `authorized_networks`, Dataplane V2
# (enforces the NetworkPolicy in deploy/kuberay/networkpolicy.yaml), a dedicated least-privilege
# node service account instead of the Compute Engine default one, the REGULAR release channel
# with a weekend maintenance window instead of RAPID auto-upgrades at any time.

resource "google_compute_network" "this" {
  name                    = var.name
  auto_create_subnetworks = false
  depends_on              = [google_project_service.apis]
}

resource "google_compute_subnetwork" "nodes" {
  name                     = "${var.name}-nodes"
  network                  = google_compute_network.this.id
  region                   = var.region
  ip_cidr_range            = var.nodes_cidr
  private_ip_google_access = true # Pub/Sub, Monitoring, GCS, Artifact Registry without public IPs

  secondary_ip_range {
    range_name    = "pods"
    ip_cidr_range = var.pods_cidr
  }
  secondary_ip_range {
    range_name    = "services"
    ip_cidr_range = var.services_cidr
  }
}

resource "google_container_cluster" "this" {
  name     = var.name
  location = var.region

  network    = google_compute_network.this.id
  subnetwork = google_compute_subnetwork.nodes.id

  remove_default_node_pool = true
  initial_node_count       = 1
  deletion_protection      = false

  # The default pool exists for a moment before removal: not as the Compute Engine default SA.
  node_config {
    service_account = google_service_account.nodes.email
    oauth_scopes    = ["https://www.googleapis.com/auth/cloud-platform"]
  }

  ip_allocation_policy {
    cluster_secondary_range_name  = "pods"
    services_secondary_range_name = "services"
  }

  private_cluster_config {
    enable_private_nodes    = true
    enable_private_endpoint = false # public endpoint, but only for authorized_networks
    master_ipv4_cidr_block  = var.master_cidr
  }

  master_authorized_networks_config {
    dynamic "cidr_blocks" {
      for_each = var.authorized_networks
      content {
        cidr_block   = cidr_blocks.value
        display_name = "operators"
      }
    }
  }

  datapath_provider = "ADVANCED_DATAPATH" # Dataplane V2: NetworkPolicy enforced

  workload_identity_config {
    workload_pool = "${var.project_id}.svc.id.goog"
  }

  addons_config {
    gcs_fuse_csi_driver_config {
      enabled = true
    }
    ray_operator_config {
      enabled = true
    }
  }

  release_channel {
    channel = "REGULAR"
  }

  # Upgrades (which recreate TPU hosts) only inside this window; a long run can add a
  # maintenance exclusion (deploy/README.md).
  maintenance_policy {
    recurring_window {
      start_time = var.maintenance_start
      end_time   = var.maintenance_end
      recurrence = var.maintenance_recurrence
    }
  }

  depends_on = [google_project_service.apis]
}

resource "google_container_node_pool" "cpu" {
  name     = "cpu"
  cluster  = google_container_cluster.this.id
  location = var.region

  node_count = 1

  node_config {
    machine_type    = "e2-standard-8"
    service_account = google_service_account.nodes.email
    # With a dedicated node SA, access is decided by its IAM roles (iam.tf); the scope only
    # stops being a second, coarser filter (Google's recommendation for custom node SAs).
    oauth_scopes = ["https://www.googleapis.com/auth/cloud-platform"]
    workload_metadata_config {
      mode = "GKE_METADATA"
    }
    shielded_instance_config {
      enable_secure_boot = true
    }
  }
}

resource "google_container_node_pool" "tpu_slice" {
  count          = var.tpu_slices
  name           = "tpu-slice-${count.index}"
  cluster        = google_container_cluster.this.id
  location       = var.region
  node_locations = [var.zone]

  node_count = var.tpu_hosts_per_slice

  placement_policy {
    type         = "COMPACT"
    tpu_topology = var.tpu_topology
  }

  node_config {
    machine_type    = var.tpu_machine_type
    spot            = var.tpu_spot
    service_account = google_service_account.nodes.email
    oauth_scopes    = ["https://www.googleapis.com/auth/cloud-platform"]
    workload_metadata_config {
      mode = "GKE_METADATA"
    }
  }

  management {
    auto_repair  = true
    auto_upgrade = true # required on a release channel; confined to the maintenance window
  }
}
