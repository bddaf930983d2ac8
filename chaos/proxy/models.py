"""Pydantic models of the JSON that crosses the API boundary (Toxiproxy 2.x shapes).

Requests are validated strictly (a string where Toxiproxy's Go structs hold a number or a
bool is a 400, as Go's JSON decoder rejects it); unknown keys are ignored, as Go ignores them.
Responses are built from :class:`ProxyInfo` and :class:`ToxicInfo`, which the client reuses.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Stream = Literal["upstream", "downstream"]


class _Request(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class ProxyCreate(_Request):
    """Body of ``POST /proxies`` and one item of ``POST /populate``/``--config``.

    ``listen`` is ``host:port`` (port 0 picks a free port); an empty listen means
    ``127.0.0.1:0`` here (Toxiproxy would listen on every interface).
    """

    name: str = ""
    listen: str = ""
    upstream: str = ""
    enabled: bool | None = None  # None: true (the default of create and populate)


class ProxyUpdate(_Request):
    """Body of ``PATCH``/``POST /proxies/{name}``; a missing field keeps its value."""

    listen: str | None = None
    upstream: str | None = None
    enabled: bool | None = None


class ToxicCreate(_Request):
    """Body of ``POST /proxies/{name}/toxics``; ``name`` defaults to ``<type>_<stream>``."""

    name: str = ""
    type: str = ""
    stream: str = "downstream"
    toxicity: float = 1.0
    attributes: dict[str, Any] = Field(default_factory=dict)


class ToxicUpdate(_Request):
    """Body of ``PATCH``/``POST /proxies/{name}/toxics/{toxic}``: attributes are merged."""

    toxicity: float | None = None
    attributes: dict[str, Any] = Field(default_factory=dict)


class ToxicInfo(BaseModel):
    """A toxic as the API returns it."""

    attributes: dict[str, Any] = Field(default_factory=dict)
    name: str
    type: str
    stream: Stream = "downstream"
    toxicity: float = 1.0


class ProxyInfo(BaseModel):
    """A proxy as the API returns it; ``listen`` is the address actually bound."""

    name: str
    listen: str
    upstream: str
    enabled: bool
    toxics: list[ToxicInfo] = Field(default_factory=list)


class VersionInfo(BaseModel):
    """Body of ``GET /version``."""

    version: str
