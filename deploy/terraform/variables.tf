variable "project_id" {
  description = "GCP project that hosts the cluster, topics and alerts."
  type        = string
}

variable "metrics_project_id" {
  description = "Project that receives the orchestrator's custom metrics and holds the alert policies autoresume trusts: one per cluster, holding no workloads, with no other project in its metrics scope, so that this cluster's orchestrator service account is its only metric writer. Not project_id (there the node service account and any other workload may write metrics). Cloud Monitoring grants metric writes per project, never per metric or time series (deploy/README.md, Security)."
  type        = string
  validation {
    condition     = can(regex("^[a-z][-a-z0-9]{4,28}[a-z0-9]$", var.metrics_project_id))
    error_message = "metrics_project_id: a project id (6-30 lowercase letters, digits, hyphens)."
  }
}

variable "region" {
  description = "Region of the GKE cluster (TPU v6e: e.g. us-east5, europe-west4)."
  type        = string
  default     = "us-east5"
}

variable "zone" {
  description = "Zone of the TPU node pools (must offer the TPU type)."
  type        = string
  default     = "us-east5-b"
}

variable "name" {
  description = "Prefix of every resource name."
  type        = string
  default     = "tpu-orchestrator"
}

variable "namespace" {
  description = "Kubernetes namespace of the RayCluster and the autoresume service."
  type        = string
  default     = "tpu-train"
}

variable "tpu_machine_type" {
  description = "TPU VM machine type of each host (ct6e-standard-4t: 4 v6e chips)."
  type        = string
  default     = "ct6e-standard-4t"
}

variable "tpu_topology" {
  description = "Topology of each slice; must match deploy/kuberay (4x4 = 16 chips = 4 hosts)."
  type        = string
  default     = "4x4"
}

variable "tpu_hosts_per_slice" {
  description = "Hosts per slice (= chips of the topology / chips per host)."
  type        = number
  default     = 4
}

variable "tpu_slices" {
  description = "Number of slices (one node pool each, one KubeRay worker group each)."
  type        = number
  default     = 2
}

variable "tpu_spot" {
  description = "Use Spot TPU VMs (preemptible; the orchestrator drains and autoresume resubmits)."
  type        = bool
  default     = true
}

variable "metric_prefix" {
  description = "Prefix of the orchestrator's custom metrics in Cloud Monitoring."
  type        = string
  default     = "custom.googleapis.com/tpu_orchestrator"
}

variable "metric_resource_type" {
  description = "Monitored resource type the metric exporter writes to (orchestrator/metrics)."
  type        = string
  default     = "generic_task"
}

variable "heartbeat_absent_for" {
  description = "How long the heartbeat may be missing before the alert opens an incident."
  type        = string
  default     = "600s"
}

variable "mfu_threshold" {
  description = "MFU (0..1) below which, sustained for mfu_duration, an incident opens."
  type        = number
  default     = 0.2
}

variable "mfu_duration" {
  description = "How long MFU must stay below mfu_threshold."
  type        = string
  default     = "1800s"
}

variable "loss_ceiling" {
  description = "A loss above this is treated as diverged (non-finite losses are exported above it)."
  type        = number
  default     = 1e30
}

variable "runs" {
  description = "Run names (run.name) that get their own events subscription <name>-events-<run>."
  type        = set(string)
  default     = []
  validation {
    condition     = alltrue([for r in var.runs : can(regex("^[a-z][-a-z0-9_.]{0,62}$", r))])
    error_message = "Run names: lowercase letter first, then letters, digits, - _ . (max 63)."
  }
}

variable "authorized_networks" {
  description = "CIDRs allowed to reach the GKE control plane (your office/VPN, CI). Nothing else."
  type        = list(string)
  default     = []
}

variable "master_cidr" {
  description = "/28 for the private control plane endpoint."
  type        = string
  default     = "172.16.0.16/28"
}

variable "nodes_cidr" {
  description = "Primary range of the node subnet."
  type        = string
  default     = "10.10.0.0/20"
}

variable "pods_cidr" {
  description = "Secondary range for pods."
  type        = string
  default     = "10.20.0.0/14"
}

variable "services_cidr" {
  description = "Secondary range for services."
  type        = string
  default     = "10.24.0.0/20"
}

variable "node_name_prefix" {
  description = "Name prefix of this cluster's node VMs for the Logging sinks; empty = gke-<name>-. Check with `gcloud compute instances list` (GKE may shorten long names)."
  type        = string
  default     = ""
}

variable "maintenance_start" {
  description = "Start of the recurring maintenance window (RFC 3339; only its time of day and weekday count)."
  type        = string
  default     = "2026-01-03T02:00:00Z"
}

variable "maintenance_end" {
  description = "End of the first maintenance window (RFC 3339)."
  type        = string
  default     = "2026-01-03T10:00:00Z"
}

variable "maintenance_recurrence" {
  description = "RFC 5545 RRULE of the maintenance window."
  type        = string
  default     = "FREQ=WEEKLY;BYDAY=SA,SU"
}
