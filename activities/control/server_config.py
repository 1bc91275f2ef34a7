"""The server configuration file (YAML) and the nodes file it may name.

    engines: {...}            # workflows/engine_plan.py; absent: llama.cpp only
    nodes_file: nodes.yaml    # relative to this file; read by the scheduled onboarding
    refresh_schedules: false  # the two below run (agents look and re-verify themselves)
    reverify_every: 10m       # engines re-verified on every node, when refresh_schedules
    inventory_every: 5m       # every node looks at its machine again, when refresh_schedules
    onboarding_every: 1m      # the nodes file is read again

A mistake is reported with the field it is in ("engines.vllm.version: Field required"), so an
operator can fix the file without reading this code.
"""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from workflows.contracts import NodeAdd
from workflows.engine_plan import EnginesConfig

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


class ConfigError(ValueError):
    """The file is missing, is not YAML, or a field in it is wrong: the message says which."""


def parse_duration(value: object) -> timedelta:
    """`90`, `90s`, `10m`, `1.5h`, `1d`: a bare number is seconds."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value))
        if not match:
            raise ValueError(f"{value!r} is not a duration such as 30s, 10m or 1h")
        seconds = float(match.group(1)) * _UNIT_S[match.group(2) or "s"]
    if seconds <= 0:
        raise ValueError("a duration must be positive")
    return timedelta(seconds=seconds)


class ServerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    engines: EnginesConfig = Field(default_factory=EnginesConfig.default)
    nodes_file: Path | None = None
    refresh_schedules: bool = False
    reverify_every: timedelta = timedelta(minutes=10)
    inventory_every: timedelta = timedelta(minutes=5)
    onboarding_every: timedelta = timedelta(minutes=1)

    @field_validator("reverify_every", "inventory_every", "onboarding_every", mode="before")
    @classmethod
    def _duration(cls, value: object) -> timedelta:
        return parse_duration(value)


def _field_errors(err: ValidationError, where: Path) -> ConfigError:
    lines = []
    for problem in err.errors():
        field = ".".join(str(part) for part in problem["loc"]) or "(top level)"
        lines.append(f"{field}: {problem['msg']}")
    return ConfigError(f"{where}: " + "; ".join(lines))


def _read_yaml(path: Path) -> Any:
    try:
        text = path.read_text()
    except OSError as err:
        raise ConfigError(f"{path}: cannot read: {err.strerror or err}") from err
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from err


def load_server_config(path: Path | None) -> ServerConfig:
    """The configuration in `path`; the defaults when there is no file to read."""
    if path is None:
        return ServerConfig()
    raw = _read_yaml(path)
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of settings, found {type(raw).__name__}")
    if raw.get("engines") is None:
        # `engines:` written but left empty means the default, not "no engines at all".
        raw.pop("engines", None)
    try:
        config = ServerConfig.model_validate(raw)
    except ValidationError as err:
        raise _field_errors(err, path) from err
    if config.nodes_file is not None and not config.nodes_file.is_absolute():
        config = config.model_copy(update={"nodes_file": path.parent / config.nodes_file})
    return config


class _NodesFileModel(BaseModel):
    model_config = ConfigDict(extra="forbid")

    nodes: list[NodeAdd] = Field(default_factory=list)


def load_nodes_file(path: Path) -> list[NodeAdd]:
    """`nodes:` as a list of {name, address, labels, identity}; a bare list is accepted too."""
    raw = _read_yaml(path)
    if raw is None:
        return []
    if isinstance(raw, list):
        raw = {"nodes": raw}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected `nodes:` with a list, found {type(raw).__name__}")
    try:
        nodes = _NodesFileModel.model_validate(raw).nodes
    except ValidationError as err:
        raise _field_errors(err, path) from err
    names = [node.name for node in nodes]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ConfigError(f"{path}: nodes listed twice: {', '.join(duplicates)}")
    return nodes
