"""Alert-driven autoresume: turn Cloud Monitoring incidents into resubmissions of dead runs.

``python -m orchestrator.autoresume --config autoresume.yaml`` runs the service. The decision is
``policies/autoresume.py``; this package only observes (Pub/Sub, Ray job API, run directories),
persists what it did, and acts.
"""
