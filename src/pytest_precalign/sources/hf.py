"""``source: hf``: a transformers model class built from a config dict (random weights from
the seed), or ``pretrained:`` a local directory. Nothing is downloaded."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import PrecalignError, SourceError
from .imports import import_object, one_line

if TYPE_CHECKING:
    import torch

    from ..config.specs import ModelSpec


def build(spec: ModelSpec, base_dir: Path) -> torch.nn.Module:
    import torch

    what = f"{spec.where}: models.{spec.name}"
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise SourceError(
            f"{what}: source 'hf' needs transformers: pip install 'pytest-precalign[hf]'"
        ) from None
    options = spec.options
    attn = options.get("attn_implementation")
    extra: dict[str, Any] = {"attn_implementation": attn} if attn else {}
    if "pretrained" in options:
        folder = (base_dir / str(options["pretrained"])).resolve()
        if not folder.is_dir():
            raise SourceError(
                f"{what}.pretrained: {folder} is not a directory (only local models are loaded)"
            )
        cls_path = options.get("class", "transformers.AutoModelForCausalLM")
        cls = import_object(str(cls_path), base_dir, f"{what}.class")
        try:
            module = cls.from_pretrained(str(folder), local_files_only=True, **extra)
        except Exception as exc:
            raise SourceError(f"{what}.pretrained: loading {folder} failed: {one_line(exc)}") from None
    else:
        cls = import_object(str(options["class"]), base_dir, f"{what}.class")
        config_cls = getattr(cls, "config_class", None)
        if config_cls is None:
            raise SourceError(
                f"{what}.class: {options['class']} has no config_class; is it a transformers model?"
            )
        fields = dict(options.get("config") or {})
        try:
            config = config_cls(**fields, **extra)
        except Exception as exc:
            raise SourceError(f"{what}.config: {config_cls.__name__} rejected it: {one_line(exc)}") from None
        try:
            module = cls(config)
        except PrecalignError:
            raise
        except Exception as exc:
            raise SourceError(
                f"{what}: building {options['class']} raised {type(exc).__name__}: {one_line(exc)}"
            ) from None
    if not isinstance(module, torch.nn.Module):
        raise SourceError(f"{what}: {options.get('class')} did not build a torch.nn.Module")
    return module


def sliding_window(spec: ModelSpec, base_dir: Path) -> int | None:
    """The attention window the HF model's config sets (``sliding_window`` while
    ``use_sliding_window`` is not false), or None: read from its ``config:`` through its config
    class, or from a ``pretrained:`` folder's config.json; nothing is built."""
    import json

    options = spec.options
    if "pretrained" in options:
        file = (base_dir / str(options["pretrained"])).resolve() / "config.json"
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        fields = data if isinstance(data, dict) else {}
    else:
        cls = import_object(str(options["class"]), base_dir, f"{spec.where}: models.{spec.name}.class")
        config_cls = getattr(cls, "config_class", None)
        try:
            fields = vars(config_cls(**dict(options.get("config") or {}))) if config_cls else {}
        except Exception:  # the build says why, in its own words
            return None
    window = fields.get("sliding_window")
    active = fields.get("use_sliding_window", True) is not False
    return int(window) if isinstance(window, int) and not isinstance(window, bool) and active else None
