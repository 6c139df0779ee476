"""``epp check-config FILE``: validate a config and print the resolved pipeline (exit 0), or the error (exit 2)."""

from __future__ import annotations

import argparse
import sys

from epp.config.loader import config_error_text, load_config
from epp.datalayer import scrape_settings
from epp.errors import ConfigError
from epp.runtime.builtins import default_registry

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``check-config``."""
    p = sub.add_parser("check-config", help="validate an EndpointPickerConfig and print the resolved pipeline")
    p.add_argument("file", nargs="?", help="config file (default: the built-in default configuration)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Load ``args.file``; print the pipeline and return 0, or print the error and return 2."""
    registry = default_registry()
    try:
        pipeline = load_config(args.file, registry)
        scrape = scrape_settings(pipeline.config, pipeline.handle, registry)  # validates dataLayer references
    except ConfigError as exc:
        print(f"error: {config_error_text(exc)}", file=sys.stderr)
        return 2
    print(pipeline.describe())
    off = "off (dataLayer.injectDefaults is false and no metrics-data-source is listed)"
    print("metrics scraping: " + (f"every {scrape[0].interval * 1000:g} ms, {scrape[0].scheme}://<endpoint>"
                                   f"{scrape[0].path}" if scrape is not None else off))
    return 0
