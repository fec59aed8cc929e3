"""What secures a v2 connection: TLS files (a certificate and key to serve with, a CA
bundle to trust) and the bearer token (given, read from a file, or from the
environment), each checked where it enters."""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from ridgeline.errors import ConfigError


class TlsFiles(BaseModel):
    """What a server serves TLS with: ``cert`` (PEM, the chain) and ``key`` (PEM)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cert: Path
    key: Path

    def server_context(self) -> ssl.SSLContext:
        """An SSL context for an HTTP server; a file that is missing or not PEM is a
        ConfigError naming it."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            context.load_cert_chain(self.cert, self.key)
        except (OSError, ssl.SSLError) as e:
            raise ConfigError(
                f"cannot load the TLS certificate {self.cert} with key {self.key} ({_why(e)}); "
                "give a PEM certificate (--tls-cert) and its PEM private key (--tls-key)"
            ) from None
        return context

    def grpc_credentials(self) -> Any:
        """grpc server credentials over the same files."""
        import grpc

        pair = (self.key.read_bytes(), self.cert.read_bytes())
        return grpc.ssl_server_credentials([pair])


def tls_files(cert: Path | None, key: Path | None) -> TlsFiles | None:
    """``TlsFiles`` when both are given, None when neither; one alone is a ConfigError."""
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise ConfigError("TLS needs both --tls-cert and --tls-key (PEM files); give both")
    files = TlsFiles(cert=cert, key=key)
    files.server_context()  # a bad pair is named where it is given, not at bind
    return files


def client_context(ca_file: Path | None) -> ssl.SSLContext:
    """An SSL context verifying servers against the system's CAs, and ``ca_file``'s."""
    context = ssl.create_default_context()
    if ca_file is not None:
        try:
            context.load_verify_locations(cafile=ca_file)
        except (OSError, ssl.SSLError) as e:
            raise ConfigError(
                f"cannot load the CA bundle {ca_file} ({_why(e)}); give a PEM file of the "
                "certificates to trust (--tls-ca)"
            ) from None
    return context


def grpc_root_certificates(ca_file: Path | None) -> bytes | None:
    """The PEM bytes grpc's channel credentials take (None: grpc's own roots)."""
    if ca_file is None:
        return None
    client_context(ca_file)  # the same check as HTTP's
    return ca_file.read_bytes()


def _why(e: OSError | ssl.SSLError) -> str:
    if isinstance(e, ssl.SSLError):
        return e.reason or str(e)
    return e.strerror or str(e)


TOKEN_ENV = "RIDGELINE_TOKEN"
"""The environment variable a bearer token is read from when none is given."""


def check_token(token: str, source: str = "the bearer token") -> str:
    """``token`` when a header can carry it: visible ASCII, no spaces, not empty."""
    if not token or not all("!" <= c <= "~" for c in token):
        raise ConfigError(
            f"{source} is empty or holds a space, a line break or a non-ASCII character, "
            "which an Authorization header cannot carry; give visible ASCII characters only"
        )
    return token


def resolve_token(
    token: str | None, token_file: Path | None, environ: Mapping[str, str] = os.environ
) -> str | None:
    """The bearer token: ``token`` (the command line: visible in ``ps``), else the
    contents of ``token_file`` (less surrounding whitespace), else ``$RIDGELINE_TOKEN``
    when set and not empty, else None; each checked by ``check_token``."""
    if token is not None and token_file is not None:
        raise ConfigError("give --token or --token-file, not both")
    if token is not None:
        return check_token(token, "--token")
    if token_file is not None:
        try:
            text = token_file.read_bytes().decode("utf-8").strip()
        except OSError as e:
            raise ConfigError(
                f"cannot read --token-file {token_file}: {e.strerror or e}; give a readable "
                "file holding the token"
            ) from None
        except UnicodeDecodeError:
            raise ConfigError(
                f"--token-file {token_file} is not UTF-8 text; write the token as plain text"
            ) from None
        return check_token(text, f"the token in --token-file {token_file}")
    from_env = environ.get(TOKEN_ENV, "")
    return check_token(from_env.strip(), f"${TOKEN_ENV}") if from_env else None
