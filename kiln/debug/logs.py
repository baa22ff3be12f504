"""KILN_LOGS: the counterpart of TORCH_LOGS.

`KILN_LOGS=graph_breaks,guards,recompiles` turns on those artifacts; each is a logger
named `kiln.<artifact>` writing to stderr. `+all`/`all` turns on every one. Code asks
`enabled("guards")` before building an expensive message, and logs with `log(...)`.
"""
import logging
import os
import sys

ARTIFACTS = ("graph_breaks", "guards", "recompiles", "graph", "graph_code", "dynamic",
             "perf_hints", "output_code", "bytecode", "aot", "schedule", "ddp")

_enabled = set()
_handler = logging.StreamHandler(sys.stderr)
_handler.setFormatter(logging.Formatter("[kiln.%(artifact)s] %(message)s"))


class _ArtifactFilter(logging.Filter):
    def filter(self, record):
        record.artifact = record.name.split(".", 1)[-1]
        return True


_handler.addFilter(_ArtifactFilter())


def set_logs(spec):
    """Turn on the artifacts named in `spec` ("a,b,c", a list, or "all"); others off."""
    names = spec.split(",") if isinstance(spec, str) else list(spec or ())
    names = [n.strip().lstrip("+") for n in names if n.strip()]
    unknown = [n for n in names if n not in ARTIFACTS and n != "all"]
    if unknown:
        raise ValueError(f"unknown KILN_LOGS artifact(s) {unknown}; known: {', '.join(ARTIFACTS)}, all")
    _enabled.clear()
    _enabled.update(ARTIFACTS if "all" in names else names)
    for name in ARTIFACTS:
        logger = logging.getLogger(f"kiln.{name}")
        on = name in _enabled
        logger.setLevel(logging.DEBUG if on else logging.WARNING)
        if on and _handler not in logger.handlers:
            logger.addHandler(_handler)
        elif not on and _handler in logger.handlers:
            logger.removeHandler(_handler)


def enabled(artifact):
    return artifact in _enabled


def log(artifact, msg, *args):
    """Log `msg % args` under `artifact` when it is on (cheap when it is off)."""
    if artifact in _enabled:
        logging.getLogger(f"kiln.{artifact}").info(msg, *args)


try:
    set_logs(os.environ.get("KILN_LOGS", ""))
except ValueError as e:  # a typo in the environment should not break import
    print(f"kiln: {e}", file=sys.stderr)
