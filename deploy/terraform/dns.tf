# Google APIs at addresses a NetworkPolicy can name (deploy/kuberay/networkpolicy.yaml).
#
# A NetworkPolicy allows addresses, not host names, and the public addresses of *.googleapis.com
# are many and change. This private zone, visible only inside the cluster's VPC, resolves every
# *.googleapis.com name to private.googleapis.com, 199.36.153.8/30, which Private Google Access
# (gke.tf, the node subnet) routes to Google's API front ends without leaving Google's network.
# The pods' egress policy then allows TCP 443 to that /30 and nothing else outside the cluster.
# The route is explicit so that removing the VPC's default route does not cut the APIs off.

resource "google_dns_managed_zone" "googleapis" {
  name       = "${var.name}-googleapis"
  dns_name   = "googleapis.com."
  visibility = "private"
  private_visibility_config {
    networks {
      network_url = google_compute_network.this.id
    }
  }
  depends_on = [google_project_service.apis]
}

resource "google_dns_record_set" "private_googleapis" {
  managed_zone = google_dns_managed_zone.googleapis.name
  name         = "private.googleapis.com."
  type         = "A"
  ttl          = 300
  rrdatas      = ["199.36.153.8", "199.36.153.9", "199.36.153.10", "199.36.153.11"]
}

resource "google_dns_record_set" "googleapis_cname" {
  managed_zone = google_dns_managed_zone.googleapis.name
  name         = "*.googleapis.com."
  type         = "CNAME"
  ttl          = 300
  rrdatas      = ["private.googleapis.com."]
}

resource "google_compute_route" "private_googleapis" {
  name             = "${var.name}-private-googleapis"
  network          = google_compute_network.this.name
  dest_range       = "199.36.153.8/30"
  next_hop_gateway = "default-internet-gateway"
}
