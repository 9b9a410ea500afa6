# GKE Standard cluster with Workload Identity, the GCS FUSE CSI driver and the Ray operator add-on
# (KubeRay managed by GKE), one CPU pool for the Ray head and autoresume, one TPU pool per slice.

resource "google_container_cluster" "this" {
  name     = var.name
  location = var.region

  remove_default_node_pool = true
  initial_node_count       = 1
  deletion_protection      = false

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
    channel = "RAPID"
  }

  depends_on = [google_project_service.apis]
}

resource "google_container_node_pool" "cpu" {
  name     = "cpu"
  cluster  = google_container_cluster.this.id
  location = var.region

  node_count = 1

  node_config {
    machine_type = "e2-standard-8"
    workload_metadata_config {
      mode = "GKE_METADATA"
    }
    oauth_scopes = ["https://www.googleapis.com/auth/cloud-platform"]
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
    machine_type = var.tpu_machine_type
    spot         = var.tpu_spot
    workload_metadata_config {
      mode = "GKE_METADATA"
    }
    oauth_scopes = ["https://www.googleapis.com/auth/cloud-platform"]
  }

  management {
    auto_repair  = true
    auto_upgrade = true
  }
}
