"""Prometheus metrics of one API process, on its own registry (several apps per test run).

Names follow the fleet's ``genfleet:`` prefix, as the engine metrics do.
"""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class ApiMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "genfleet:api_requests",
            "HTTP requests by route template, method and status",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.jobs_submitted = Counter(
            "genfleet:api_jobs_submitted",
            "jobs produced to the job lanes, by route and served model",
            ["route", "model_name"],
            registry=self.registry,
        )
        self.streams_open = Gauge(
            "genfleet:api_streams_open",
            "server-sent event streams open (job events and OpenAI streams)",
            registry=self.registry,
        )
        self.fleet_backlog = Gauge(
            "genfleet:api_fleet_backlog",
            "jobs in a model's jobs topic past its workers' committed offsets",
            ["model_name"],
            registry=self.registry,
        )
        self.fleet_completion_rate = Gauge(
            "genfleet:api_fleet_completion_rate",
            "jobs/s a model's workers committed over the last minute",
            ["model_name"],
            registry=self.registry,
        )
        self.fleet_rejections = Counter(
            "genfleet:api_fleet_rejections",
            "interactive requests answered 429 because a model's backlog was full",
            ["model_name"],
            registry=self.registry,
        )
        self.submit_seconds = Histogram(
            "genfleet:api_submit_seconds",
            "time to record and produce a request's jobs (Redis + Kafka acks=all)",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=self.registry,
        )


class RequestMetricsMiddleware:
    """Counts every response by the route that matched it (not the raw path: ids would
    make a new series per job)."""

    def __init__(self, app: ASGIApp, metrics: ApiMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = scope.get("route")
            self.metrics.requests.labels(
                getattr(route, "path", "unmatched"), scope["method"], str(status)
            ).inc()
