"""Load one pydantic config model from a YAML file, the environment and flags.

Every metagpu process (webhook, device plugin, agent) is configured the same
way, with NVIDIA's precedence: **flags > env > file > defaults**. Errors say
which field was wrong, what value it had, where that value came from (file,
env var or flag) and, for unknown keys, which keys are accepted: an operator
reading a crash-looping pod's log should not need the source code.

Env vars are derived from the model, not scanned: field ``tls.cert_file`` of a
model loaded with prefix ``METAGPU_WEBHOOK_`` is read from
``METAGPU_WEBHOOK_TLS__CERT_FILE``. Unknown variables with the prefix are
ignored on purpose: Kubernetes injects service-link variables such as
``METAGPU_WEBHOOK_PORT=tcp://...`` into every pod of the namespace.

:func:`split_listen` is here too: every component's ``HOST:PORT`` setting is
checked by it, so they accept and refuse the same values with the same words.
"""

from __future__ import annotations

import ipaddress
import types
import typing
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

M = TypeVar("M", bound=BaseModel)

MAX_CONFIG_FILE_BYTES = 1 << 20
"""A config file larger than 1 MiB is a mistake (a binary, a log), not a config."""


class StrictModel(BaseModel):
    """Base for every config and wire model: unknown keys are errors, values immutable.

    ``extra="forbid"`` turns a typo such as ``unitsPerGPU`` into a start-up
    error instead of a silently ignored setting.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)


class ConfigError(Exception):
    """Configuration that cannot be loaded; ``str()`` is the operator-facing message."""


def load_config(
    model: type[M],
    *,
    file: Path | None = None,
    env: Mapping[str, str] | None = None,
    env_prefix: str = "",
    flags: Mapping[str, object] | None = None,
) -> M:
    """Build ``model`` from defaults < ``file`` < ``env`` < ``flags``.

    ``flags`` maps dotted field paths (``"tls.cert_file"``) to values; ``None``
    values mean "flag not given" and are skipped, so callers can pass argparse
    results straight through. Raises :class:`ConfigError`.
    """
    data: dict[str, Any] = {}
    sources: dict[tuple[str, ...], str] = {}
    if file is not None:
        file_data = read_config_file(file)
        deep_merge(data, file_data)
        for path in _leaf_paths(file_data):
            sources[path] = f"file {file}"
    if env is not None and env_prefix:
        for path, var, raw in _env_values(model, env, env_prefix):
            _set_path(data, path, raw)
            sources[path] = f"env {var}"
    for dotted, value in (flags or {}).items():
        if value is None:
            continue
        path = tuple(dotted.split("."))
        _set_path(data, path, value)
        sources[path] = f"flag for {dotted}"
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, model=model, sources=sources)) from exc


def read_config_file(path: Path) -> dict[str, Any]:
    """Read a YAML mapping, with errors that say what is wrong with the file."""
    try:
        size = path.stat().st_size
        if size > MAX_CONFIG_FILE_BYTES:
            raise ConfigError(
                f"config file {path}: {size} bytes is larger than the "
                f"{MAX_CONFIG_FILE_BYTES} bytes a config may have"
            )
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ConfigError(f"config file {path}: no such file") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path}: cannot read: {exc}") from exc
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        where = ""
        mark = getattr(exc, "problem_mark", None)
        if mark is not None:
            where = f" at line {mark.line + 1}, column {mark.column + 1}"
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"config file {path}: invalid YAML{where}: {problem}") from exc
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(
            f"config file {path}: must be a YAML mapping of settings, got {type(loaded).__name__}"
        )
    return loaded


def format_validation_error(
    exc: ValidationError,
    *,
    model: type[BaseModel],
    sources: Mapping[tuple[str, ...], str] | None = None,
) -> str:
    """One line per problem: ``path: message (got X, from SOURCE)``."""
    lines = [f"invalid {model.__name__} ({exc.error_count()} problem(s)):"]
    for err in exc.errors(include_url=False):
        loc = tuple(str(p) for p in err["loc"])
        dotted = ".".join(loc) or "(top level)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            accepted = _fields_at(model, loc[:-1])
            msg = "unknown setting"
            if accepted:
                msg += f"; accepted here: {', '.join(sorted(accepted))}"
        detail = []
        if err["type"] != "missing" and "input" in err:
            detail.append(f"got {_short(err['input'])}")
        source = _source_for(loc, sources or {})
        if source:
            detail.append(f"from {source}")
        suffix = f" ({', '.join(detail)})" if detail else ""
        lines.append(f"  {dotted}: {msg}{suffix}")
    return "\n".join(lines)


def deep_merge(into: dict[str, Any], other: Mapping[str, Any]) -> None:
    """Merge ``other`` into ``into``; mappings merge key by key, anything else replaces."""
    for key, value in other.items():
        current = into.get(key)
        if isinstance(current, dict) and isinstance(value, Mapping):
            deep_merge(current, value)
        else:
            into[key] = value


def env_var_names(model: type[BaseModel], prefix: str) -> dict[str, tuple[str, ...]]:
    """Every env var a model reads, mapped to its field path (for docs and ``--help``)."""
    return {prefix + "__".join(p).upper(): p for p in _model_paths(model)}


def split_listen(value: str, *, example: str) -> tuple[str, int]:
    """``"127.0.0.1:8443"`` → ``("127.0.0.1", 8443)``; ``"[::1]:8443"`` → ``("::1", 8443)``.

    The one parser of every ``HOST:PORT`` setting (webhook ``listen``, extender
    ``listen``, agent ``metrics_listen``), so all three refuse the same mistakes
    with the same words. Each ``ValueError`` says what was wrong and shows
    ``example`` (the caller's default, e.g. ``"127.0.0.1:8443"``) as what would be
    accepted. An IPv6 host must be bracketed (``[::1]:8443``, as in a URL): a bare
    ``::1:8443`` is ambiguous, and without this check it would be split into host
    ``::1`` by accident of ``rpartition``. An empty host is refused rather than
    read as "every interface", which only some servers do.
    """
    port_example = example.rpartition(":")[2]
    shown = _short(value)
    host, sep, port_text = value.rpartition(":")
    if not sep or not port_text.isascii() or not port_text.isdigit():
        raise ValueError(f"must be HOST:PORT with a numeric port, e.g. {example}: {shown}")
    # Compare the text before int(): a port of thousands of digits would otherwise
    # hit Python's int-conversion limit with an unrelated message.
    if len(port_text.lstrip("0")) > 5 or int(port_text) > 65535:
        raise ValueError(f"port must be 0..65535 (0 picks a free one), e.g. {example}: {shown}")
    if not host:
        raise ValueError(
            f"host is empty; use 0.0.0.0 for every interface ([::] for every IPv6 one), "
            f"e.g. {example}: {shown}"
        )
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(
                f"not an IPv6 address in brackets; write e.g. [::1]:{port_example} "
                f"or a name or IPv4 address without brackets, e.g. {example}: {shown}"
            ) from None
    elif ":" in host:
        raise ValueError(
            f"write an IPv6 address in brackets, e.g. [::1]:{port_example} "
            f"(an IPv4 address or name without, e.g. {example}): {shown}"
        )
    return host, int(port_text)


# ----------------------------------------------------------------- internals
def _short(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _source_for(loc: tuple[str, ...], sources: Mapping[tuple[str, ...], str]) -> str | None:
    # The error may sit below the value that was set (a list item) or the value
    # may sit below the error (a whole section from the file): try both ways.
    for n in range(len(loc), 0, -1):
        if loc[:n] in sources:
            return sources[loc[:n]]
    below = sorted({s for p, s in sources.items() if p[: len(loc)] == loc})
    return below[0] if len(below) == 1 else None


def _leaf_paths(data: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    for key, value in data.items():
        path = (*prefix, str(key))
        if isinstance(value, Mapping) and value:
            yield from _leaf_paths(value, path)
        else:
            yield path


def _set_path(data: dict[str, Any], path: tuple[str, ...], value: object) -> None:
    node = data
    for key in path[:-1]:
        child = node.get(key)
        if not isinstance(child, dict):
            child = {}
            node[key] = child
        node = child
    node[path[-1]] = value


def _submodel(annotation: object) -> type[BaseModel] | None:
    """The BaseModel inside ``X``, ``X | None`` or ``Optional[X]``, if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        models = [a for a in typing.get_args(annotation) if _submodel(a) is not None]
        if len(models) == 1:
            return _submodel(models[0])
    return None


def _is_text(annotation: object) -> bool:
    """``str`` or ``Path`` (or either, or None): a setting whose value is the string itself."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return bool(args) and all(_is_text(a) for a in args)
    return annotation in (str, Path)


def _is_sequence(annotation: object) -> bool:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_is_sequence(a) for a in typing.get_args(annotation) if a is not type(None))
    return origin in (list, tuple, set, frozenset)


def _model_paths(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    for name, field in model.model_fields.items():
        path = (*prefix, name)
        sub = _submodel(field.annotation)
        yield path
        if sub is not None:
            yield from _model_paths(sub, path)


def _fields_at(model: type[BaseModel], loc: tuple[str, ...]) -> list[str]:
    current: type[BaseModel] | None = model
    for part in loc:
        if current is None or part not in current.model_fields:
            # Lists of models: skip the index and descend into the item type.
            if current is not None and part.isdigit():
                continue
            return []
        annotation = current.model_fields[part].annotation
        inner = typing.get_args(annotation) if _is_sequence(annotation) else ()
        current = _submodel(inner[0]) if inner else _submodel(annotation)
    return list(current.model_fields) if current is not None else []


def _env_values(
    model: type[BaseModel], env: Mapping[str, str], prefix: str
) -> Iterator[tuple[tuple[str, ...], str, object]]:
    for var, path in env_var_names(model, prefix).items():
        if var not in env:
            continue
        raw = env[var]
        annotation = _annotation_at(model, path)
        yield path, var, _parse_env_value(raw, annotation, var)


def _annotation_at(model: type[BaseModel], path: tuple[str, ...]) -> object:
    current: type[BaseModel] = model
    annotation: object = None
    for part in path:
        annotation = current.model_fields[part].annotation
        sub = _submodel(annotation)
        if sub is not None:
            current = sub
    return annotation


def _parse_env_value(raw: str, annotation: object, var: str) -> object:
    """Env vars are strings; structure comes from YAML flow syntax or commas.

    ``[a, b]`` and ``{k: v}`` are parsed as YAML so lists of tolerations can be
    set from a Helm value; ``a,b`` is accepted for plain lists of strings.
    Scalars are left as strings for pydantic to coerce (``"100"`` to 100).
    """
    stripped = raw.strip()
    if _is_text(annotation):
        # A plain string setting is taken as written: "[::1]:8443" is an IPv6 listen
        # address, not a YAML list.
        return raw
    if stripped.startswith(("[", "{")):
        try:
            return yaml.safe_load(stripped)
        except yaml.YAMLError as exc:
            raise ConfigError(f"env {var}: invalid YAML flow value {raw!r}: {exc}") from exc
    if _is_sequence(annotation):
        return [item.strip() for item in stripped.split(",") if item.strip()]
    return raw
