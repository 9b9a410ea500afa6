"""The one seam to Cloud Monitoring: build a MetricServiceClient for an endpoint.

With an endpoint ("127.0.0.1:PORT") the client talks over an insecure local channel and never
looks for credentials (tests, the local MetricService). Without one it is the production client
with application-default credentials.
"""

from __future__ import annotations

import grpc
from google.cloud import monitoring_v3
from google.cloud.monitoring_v3.services.metric_service.transports import (
    MetricServiceGrpcTransport,
)


def make_client(endpoint: str | None) -> monitoring_v3.MetricServiceClient:
    if endpoint:
        channel = grpc.insecure_channel(endpoint)
        return monitoring_v3.MetricServiceClient(
            transport=MetricServiceGrpcTransport(channel=channel))
    return monitoring_v3.MetricServiceClient()
