"""The reference's legacy metric flags, end to end: ``epp serve`` with the Helm chart's SGLang args scrapes an
SGLang-format page through the default engine, on the path ``--model-server-metrics-path`` names."""

from __future__ import annotations

from pathlib import Path

from epp.cli.main import build_parser
from epp.cli.serve import options_from_args
from epp.runtime.app import EppApp

from ..conftest import eventually
from .helpers import MetricsServer

SGLANG_PAGE = b"""\
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m"} 6.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m"} 2.0
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="m"} 0.42
sglang:cache_config_info{page_size="32",num_pages="1000"} 1
"""


async def test_the_charts_sglang_flags_read_an_sglang_page(metrics_server: MetricsServer, tmp_path: Path) -> None:
    metrics_server.serve(SGLANG_PAGE)
    endpoints = tmp_path / "endpoints.yaml"
    endpoints.write_text(f"endpoints:\n  - {{name: s, address: 127.0.0.1, port: {metrics_server.port}}}\n")
    args = build_parser().parse_args([
        "serve", "--endpoints", str(endpoints), "--grpc-port", "-1", "--health-port", "-1", "--metrics-port", "-1",
        "--refresh-metrics-interval", "20ms", "--model-server-metrics-path", '"/custom/path"',
        '--total-queued-requests-metric="sglang:num_queue_reqs"',
        '--total-running-requests-metric="sglang:num_running_reqs"',
        '--kv-cache-usage-percentage-metric="sglang:token_usage"', '--cache-info-metric="sglang:cache_config_info"',
        "--lora-info-metric", ""])
    app = EppApp(options_from_args(args))
    await app.start()
    try:
        endpoint = app.datastore.endpoints()[0]
        await eventually(lambda: endpoint.metrics.update_time > 0, what="a successful scrape")
        m = endpoint.metrics
        assert (m.waiting, m.running, m.kv_usage, m.block_size, m.num_gpu_blocks) == (2, 6, 0.42, 32, 1000)
        assert metrics_server.last_path == "/custom/path"
    finally:
        await app.stop()
