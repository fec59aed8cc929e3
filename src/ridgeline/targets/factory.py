"""One URL names a target: the scheme (and, for HTTP, the path) picks the adapter.

Each scheme has a builder registered in ``TARGET_SCHEMES`` (``@_scheme("http",
"https")``); an unknown scheme lists the valid ones.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from urllib.parse import SplitResult, urlsplit

from ridgeline._registry import Registry
from ridgeline.errors import ConfigError
from ridgeline.targets._http import with_token
from ridgeline.targets.base import Target
from ridgeline.targets.http import HttpTarget
from ridgeline.targets.inprocess import InProcessTarget, load_callable, null_target
from ridgeline.targets.openai import OpenAITarget
from ridgeline.targets.options import TargetOptions
from ridgeline.targets.v2_grpc import V2GrpcTarget
from ridgeline.targets.v2_http import V2HttpTarget

_V2_MODEL = re.compile(
    r"^(?P<prefix>.*?)/v2/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?(?:/infer)?/?$"
)
_V2_BARE = re.compile(r"^(?P<prefix>.*?)/v2(?:/models)?/?$")
_GRPC_MODEL = re.compile(r"^/(?:v2/models/)?(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?/?$")


def make_target(url: str, options: TargetOptions | None = None) -> Target:
    """The target ``url`` names (see ``describe_target_urls``), given ``options``;
    nothing is contacted yet. ``options.token`` is sent as ``Authorization: Bearer``;
    https and grpcs servers are verified against the system's CAs and ``ca_file``'s (PEM)."""
    scheme = url.partition("://")[0].lower() if "://" in url else ""
    if not scheme:
        raise TARGET_SCHEMES.unknown(url)
    builder = TARGET_SCHEMES.get(scheme)
    options = options or TargetOptions()
    sent = replace(options, headers=with_token(options.headers, options.token))  # checked
    return builder(url, sent)


_Builder = Callable[[str, TargetOptions], Target]
TARGET_SCHEMES: Registry[_Builder] = Registry("target scheme")
"""The builder of each URL scheme's target."""


def _scheme(*names: str) -> Callable[[_Builder], _Builder]:
    """Register a builder under each of ``names``."""

    def add(builder: _Builder) -> _Builder:
        for name in names:
            TARGET_SCHEMES.add(name, builder)
        return builder

    return add


def describe_target_urls() -> str:
    """The URL forms ``make_target`` understands, for command-line help."""
    return _DESCRIPTION


def _split(url: str, form: str) -> SplitResult:
    try:
        parts = urlsplit(url)
    except ValueError as e:  # "Invalid IPv6 URL": a '[' without its ']'
        raise ConfigError(f"target URL {url!r} cannot be read ({e}); write {form}") from None
    try:
        port = parts.port
    except ValueError:
        raise ConfigError(f"target URL {url!r} has a bad port; write {form}") from None
    if not parts.hostname:
        raise ConfigError(f"target URL {url!r} has no host; write {form}")
    try:
        parts.hostname.encode("idna")
    except UnicodeError:  # what the HTTP and gRPC clients would raise when they connect
        raise ConfigError(
            f"target URL {url!r} has a host no DNS name can be; write {form}"
        ) from None
    if port is None and parts.scheme.startswith("grpc"):
        raise ConfigError(f"target URL {url!r} has no port; write {form}")
    return parts


@_scheme("http", "https")
def _http(url: str, options: TargetOptions) -> Target:
    parts = _split(url, "http://HOST:PORT/PATH")
    if options.body is not None:  # a body template asks for the generic target
        return _generic(url, options)
    root = f"{parts.scheme}://{parts.netloc}"
    v2 = _V2_MODEL.match(parts.path)
    if v2 is not None:
        return V2HttpTarget(
            root + v2["prefix"],
            v2["name"],
            version=v2["version"],
            inputs=options.inputs,
            headers=options.headers,
            ca_file=options.ca_file,
        )
    bare = _V2_BARE.match(parts.path)
    if bare is not None:
        if options.model is None:
            raise ConfigError(
                f"v2 target URL {url!r} names no model; write "
                f"{root}{bare['prefix']}/v2/models/NAME[/versions/V], or give the model option"
            )
        return V2HttpTarget(
            root + bare["prefix"],
            options.model,
            inputs=options.inputs,
            headers=options.headers,
            ca_file=options.ca_file,
        )
    return _generic(url, options)


def _generic(url: str, options: TargetOptions) -> Target:
    return HttpTarget(
        url,
        method=options.method,
        headers=options.headers,
        body=options.body,
        ca_file=options.ca_file,
    )


@_scheme("grpc", "grpcs")
def _grpc(url: str, options: TargetOptions) -> Target:
    form = "grpc://HOST:PORT/MODEL[/versions/V] (or grpc://HOST:PORT/v2/models/MODEL)"
    parts = _split(url, form)
    path = parts.path.rstrip("/")
    name, version = options.model, None
    if path:
        found = _GRPC_MODEL.match(path)
        if found is None:
            raise ConfigError(f"gRPC target URL {url!r} has path {path!r}; write {form}")
        name, version = found["name"], found["version"]
    if name is None:
        raise ConfigError(f"gRPC target URL {url!r} names no model; write {form}")
    return V2GrpcTarget(
        parts.netloc,
        name,
        version=version,
        inputs=options.inputs,
        headers=options.headers,
        tls=parts.scheme == "grpcs",
        ca_file=options.ca_file,
    )


@_scheme("openai+http", "openai+https")
def _openai(url: str, options: TargetOptions) -> Target:
    plain = url.split("+", 1)[1]
    parts = _split(plain, "openai+http://HOST:PORT[/v1]")
    path = parts.path.rstrip("/") or "/v1"
    return OpenAITarget(
        f"{parts.scheme}://{parts.netloc}{path}",
        model=options.model,
        api=options.openai_api,
        stream=options.stream,
        headers=options.headers,
        ca_file=options.ca_file,
        ignore_eos=options.ignore_eos,
        tokenizer=options.tokenizer,
    )


@_scheme("python")
def _python(url: str, options: TargetOptions) -> Target:
    spec = url.split("://", 1)[1]
    return InProcessTarget(load_callable(spec), name=spec)


@_scheme("null")
def _null(url: str, options: TargetOptions) -> Target:
    return null_target()


_DESCRIPTION = """\
Target URLs:
  http(s)://HOST:PORT/v2/models/NAME[/versions/V]
                                 Open Inference Protocol v2 over HTTP (KServe, Triton, MLServer)
  grpc(s)://HOST:PORT/NAME[/versions/V]
                                 v2 over gRPC (also grpc://HOST:PORT/v2/models/NAME)
  openai+http(s)://HOST:PORT[/v1]
                                 OpenAI-compatible completions or chat, streamed; the model
                                 is the model option, or the first the server lists
  http(s)://HOST:PORT/PATH       any other HTTP endpoint (or any URL given a body template):
                                 method, headers and a body with {items}, {prompt_tokens},
                                 {output_tokens}, {prompt}, {prompt_json} replaced per
                                 request; 2xx = ok
  python://package.module:function
                                 an in-process callable fn(shape) -> Reply | bool | None
  null://                        answers at once: measures the load generator itself
"""
