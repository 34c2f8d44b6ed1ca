"""Files saved beside a model's weights, in a local folder or a Hub repository."""

from __future__ import annotations

import os

HUB_OPTIONS = ("cache_dir", "revision", "token", "local_files_only")


def hub_options(kwargs: dict) -> dict:
    """The ``from_pretrained`` keyword arguments that say where and how to fetch files from the Hub."""
    return {k: kwargs[k] for k in HUB_OPTIONS if kwargs.get(k) is not None}


def companion_file(name_or_path, filename: str, kwargs: dict | None = None) -> str | None:
    """Path of ``filename`` saved beside the weights of ``name_or_path`` (a local folder or a Hub
    repository, fetched with ``kwargs``' Hub options), or None if it is absent."""
    kwargs = kwargs or {}
    if os.path.isdir(str(name_or_path)):
        path = os.path.join(str(name_or_path), filename)
        return path if os.path.isfile(path) else None
    from transformers.utils import cached_file

    return cached_file(
        name_or_path,
        filename,
        cache_dir=kwargs.get("cache_dir"),
        revision=kwargs.get("revision"),
        token=kwargs.get("token"),
        local_files_only=kwargs.get("local_files_only", False),
        _raise_exceptions_for_missing_entries=False,
        _raise_exceptions_for_connection_errors=False,
    )
