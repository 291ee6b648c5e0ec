"""Serving live metrics to Prometheus: an HTTP endpoint in its text format, fed by a run follower.

`Exporter` serves the latest `Snapshot` (`ppscope.live.metrics`) at http://HOST:PORT/metrics through the
`prometheus_client` library (the optional extra `ppscope[metrics]`, imported only here, when a command asks
for it); `BackgroundWatch` follows a run in a thread of its own, for `ppscope run --prometheus-port`, whose
main thread runs the engine. What the metrics mean is `ppscope.live`'s business; this module only serves them.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from ppscope.cli.commands.dashboard import is_loopback
from ppscope.errors import ErrorCode, InvalidConfigError, PPScopeError
from ppscope.live.follow import RunFollower, follow
from ppscope.live.metrics import SPECS, Snapshot
from ppscope.trace.store import META_FILE

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

__all__ = ["DEFAULT_HOST", "BackgroundWatch", "Exporter", "is_loopback", "load_client"]

DEFAULT_HOST = "127.0.0.1"


def load_client() -> ModuleType:
    """The `prometheus_client` module, or a one-line error saying how to install it."""
    try:
        import prometheus_client
        import prometheus_client.core
        import prometheus_client.utils
    except ImportError:
        raise PPScopeError(
            ErrorCode.NOT_INSTALLED,
            "serving metrics needs prometheus_client, which is not installed: pip install 'ppscope[metrics]'",
        ) from None
    return prometheus_client


class Exporter:
    """An HTTP server answering /metrics with the last snapshot published (none: only the metadata lines)."""

    def __init__(self, host: str, port: int) -> None:
        if not 0 <= port < 65536:
            raise InvalidConfigError(
                ErrorCode.BAD_VALUE, f"the metrics port must be between 0 (any free one) and 65535, got {port}"
            )
        client = load_client()
        self._snapshot = Snapshot()
        registry = client.CollectorRegistry(auto_describe=False)
        registry.register(_Collector(self, client))
        try:
            self._server, self._thread = client.start_http_server(port, addr=host, registry=registry)
        except (OSError, OverflowError, UnicodeError) as exc:
            why = getattr(exc, "strerror", None) or str(exc)
            raise InvalidConfigError(ErrorCode.CANNOT_LISTEN, f"cannot serve metrics on {host}:{port}: {why}") from None
        self.host = host
        self.port = int(self._server.server_port)
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{self.port}/metrics"

    @property
    def snapshot(self) -> Snapshot:
        return self._snapshot

    def publish(self, snapshot: Snapshot) -> None:
        """Serve `snapshot` from now on (one reference swap: a scrape sees the old one or the new one)."""
        self._snapshot = snapshot

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


class _Collector:
    """Turns the exporter's current snapshot into metric families at each scrape."""

    def __init__(self, exporter: Exporter, client: ModuleType) -> None:
        self._exporter = exporter
        self._core = client.core
        self._go = client.utils.floatToGoString

    def collect(self) -> Iterator[Metric]:
        snap = self._exporter.snapshot
        for spec in SPECS:
            labels = list(spec.labels)
            if spec.kind == "histogram":
                series = snap.histograms.get(spec.name, {})
                if not series:
                    continue
                hist = self._core.HistogramMetricFamily(spec.name, spec.help, labels=labels)
                for key, value in series.items():
                    buckets = [(self._go(bound), n) for bound, n in value.cumulative()]
                    hist.add_metric(list(key), buckets, sum_value=value.sum)
                yield hist
                continue
            values = snap.values.get(spec.name, {})
            if not values:
                continue
            kind = self._core.CounterMetricFamily if spec.kind == "counter" else self._core.GaugeMetricFamily
            family = kind(spec.name, spec.help, labels=labels)
            for key, number in sorted(values.items()):
                family.add_metric(list(key), number)
            yield family


class BackgroundWatch:
    """Follows a run that another thread is making, publishing each update, from the moment its directory
    holds a run to the moment it has ended (`finish`)."""

    def __init__(self, run_dir: str | os.PathLike[str], exporter: Exporter, *, window_s: float, interval_s: float):
        self.run_dir = Path(run_dir)
        self.error = ""
        """Why following stopped early (the run directory vanished or cannot be read); empty otherwise."""
        self._follower = RunFollower(self.run_dir, window_s=window_s)
        self._exporter = exporter
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="ppscope-metrics", daemon=True)
        self._thread.start()

    def _main(self) -> None:
        while not (self.run_dir / META_FILE).is_file():
            if self._stop.wait(0.1):
                return
        try:
            follow(self._follower, self._exporter.publish, interval_s=self._interval_s, stop=self._stop)
        except PPScopeError as exc:
            self.error = str(exc)

    def finish(self, timeout_s: float = 30.0) -> None:
        """The run has ended: give the watcher `timeout_s` to read the end of it, then stop it."""
        if not (self.run_dir / META_FILE).is_file():  # the run never started
            self._stop.set()
        self._thread.join(timeout_s)
        self._stop.set()
        self._thread.join(timeout_s)
