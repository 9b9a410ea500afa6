"""Cloud Monitoring export: metric definitions, window aggregation, the rule-abiding writer."""
