"""The local MetricService's gRPC server on loopback (the rules it enforces:
``tests/support/metric_service.py``)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from concurrent import futures
from typing import Any

import grpc
from google.cloud import monitoring_v3
from google.protobuf import any_pb2, empty_pb2
from google.rpc import status_pb2
from grpc_status import rpc_status

from tests.support.metric_service import SERVICE, MetricServiceState


def _abort(context: grpc.ServicerContext, code: grpc.StatusCode, message: str,
           summary: Any | None) -> None:
    status = status_pb2.Status(code=code.value[0], message=message)
    if summary is not None:
        detail = any_pb2.Any()
        detail.Pack(monitoring_v3.CreateTimeSeriesSummary.pb(summary))
        status.details.append(detail)
    context.abort_with_status(rpc_status.to_status(status))


class LocalMetricService:
    """gRPC server on 127.0.0.1:<free port> serving the MetricService methods we use."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.state = MetricServiceState(clock)
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        self._server.add_generic_rpc_handlers((self._handlers(),))
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{self.port}"

    def _handlers(self) -> grpc.GenericRpcHandler:
        m = monitoring_v3
        empty = empty_pb2.Empty.SerializeToString

        def create_time_series(req: Any, context: grpc.ServicerContext) -> Any:
            code, message, summary = self.state.create_time_series(req)
            if code != grpc.StatusCode.OK:
                _abort(context, code, message, summary)
            return empty_pb2.Empty()

        def create_metric_descriptor(req: Any, context: grpc.ServicerContext) -> Any:
            code, message, stored = self.state.create_metric_descriptor(req)
            if code != grpc.StatusCode.OK:
                _abort(context, code, message, None)
            return stored

        def get_metric_descriptor(req: Any, context: grpc.ServicerContext) -> Any:
            mtype = req.name.split("/metricDescriptors/", 1)[-1]
            with self.state.lock:
                d = self.state.descriptors.get(mtype)
            if d is None:
                context.abort(grpc.StatusCode.NOT_FOUND, f"Could not find descriptor {mtype}")
            return d

        def list_metric_descriptors(req: Any, context: grpc.ServicerContext) -> Any:
            with self.state.lock:
                ds = list(self.state.descriptors.values())
            return m.ListMetricDescriptorsResponse(metric_descriptors=ds)

        def list_time_series(req: Any, context: grpc.ServicerContext) -> Any:
            want = re.search(r'metric\.type\s*=\s*"([^"]+)"', req.filter)
            series: dict[tuple, Any] = {}
            with self.state.lock:
                for p in self.state.record.accepted:
                    if want and p.metric_type != want[1]:
                        continue
                    key = (p.metric_type, tuple(sorted(p.metric_labels.items())))
                    ts = series.setdefault(key, m.TimeSeries(
                        metric={"type": p.metric_type, "labels": p.metric_labels},
                        resource={"type": "generic_task", "labels": p.resource_labels}))
                    value = ({"int64_value": p.value} if isinstance(p.value, int)
                             else {"double_value": p.value})
                    ts.points.insert(0, m.Point(
                        interval={"end_time": {"seconds": int(p.end),
                                               "nanos": int((p.end % 1) * 1e9)}},
                        value=value))
            return m.ListTimeSeriesResponse(time_series=list(series.values()))

        def unary(fn: Callable, req_type: Any, ser: Callable) -> grpc.RpcMethodHandler:
            return grpc.unary_unary_rpc_method_handler(
                fn, request_deserializer=req_type.deserialize, response_serializer=ser)

        def pb_ser(msg: Any) -> bytes:
            return msg.SerializeToString()

        return grpc.method_handlers_generic_handler(SERVICE, {
            "CreateTimeSeries": unary(create_time_series, m.CreateTimeSeriesRequest, empty),
            "CreateMetricDescriptor": unary(create_metric_descriptor,
                                            m.CreateMetricDescriptorRequest, pb_ser),
            "GetMetricDescriptor": unary(get_metric_descriptor, m.GetMetricDescriptorRequest,
                                         pb_ser),
            "ListMetricDescriptors": unary(list_metric_descriptors,
                                           m.ListMetricDescriptorsRequest,
                                           m.ListMetricDescriptorsResponse.serialize),
            "ListTimeSeries": unary(list_time_series, m.ListTimeSeriesRequest,
                                    m.ListTimeSeriesResponse.serialize),
        })

    def start(self) -> LocalMetricService:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop(grace=0).wait(5)

    def __enter__(self) -> LocalMetricService:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
