"""OpenVINO's and NNCF's usage telemetry turned off for this process, without touching the user's own opt-in.

OpenVINO's model converter (`openvino.convert_model`) and NNCF report usage to Google Analytics through the
`openvino_telemetry` package unless the user opted out with `opt_in_out --opt_out`, which writes the consent file
`~/intel/openvino_telemetry` and so decides for every OpenVINO program of that user. Neither package reads an
environment variable that turns it off (openvino_telemetry 2025.2), but both fall back to a stub that sends
nothing when `openvino_telemetry` cannot be imported: `disable_telemetry` makes that import fail in this process
only (a `None` entry in `sys.modules`), so nothing is written under `~/intel`, no sending process is forked and no
connection is opened, while other programs keep the user's choice. docs/facts.md has the details.
"""

from __future__ import annotations

import sys
from typing import Any

TELEMETRY_MODULE = "openvino_telemetry"


def disable_telemetry() -> None:
    """Turn OpenVINO's and NNCF's telemetry off in this process; call it before either is imported (idempotent).

    Where `openvino_telemetry` was imported already (a program that used OpenVINO before calling the tool), its
    instance is told that there is no consent, which every sending method checks.
    """
    module: Any = sys.modules.get(TELEMETRY_MODULE)
    if module is None:
        sys.modules[TELEMETRY_MODULE] = None  # type: ignore[assignment]  # import raises ImportError: the stubs
        return
    instance = getattr(module.Telemetry, "_SingletonMetaClass__single_instance", None)
    if instance is not None:
        instance.consent = False


def telemetry_disabled() -> bool:
    """Return whether `disable_telemetry` blocked the telemetry package in this process."""
    return TELEMETRY_MODULE in sys.modules and sys.modules[TELEMETRY_MODULE] is None
