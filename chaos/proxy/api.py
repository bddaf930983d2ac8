"""Toxiproxy 2.x's REST API on aiohttp, in the same event loop as the proxies.

Routes, bodies and status codes follow ``api.go`` in Shopify/toxiproxy::

    GET    /proxies                      200 {name: proxy}
    POST   /proxies                      201 proxy            400 / 409 / 500 (listen failed)
    POST   /populate                     201 {"proxies": [..]}  on error: {"error", "status",
                                                                          "proxies"} with status
    GET    /proxies/{proxy}              200 proxy            404
    POST|PATCH  /proxies/{proxy}         200 proxy            400 / 404 / 500
    DELETE /proxies/{proxy}              204                  404
    GET    /proxies/{proxy}/toxics       200 [toxic]          404
    POST   /proxies/{proxy}/toxics       200 toxic            400 / 404 / 409
    GET    /proxies/{proxy}/toxics/{t}   200 toxic            404
    POST|PATCH  /proxies/{proxy}/toxics/{t}  200 toxic        400 / 404
    DELETE /proxies/{proxy}/toxics/{t}   204                  404
    POST   /reset                        204
    GET    /version                      200 {"version": ...}
    GET    /metrics                      200 Prometheus text (see chaos.proxy.metrics)

A proxy is ``{"name", "listen", "upstream", "enabled", "toxics": [toxic]}``; a toxic is
``{"attributes", "name", "type", "stream", "toxicity"}``; an error is ``{"error": message,
"status": code}``. Like Toxiproxy, requests whose User-Agent starts with ``Mozilla/`` get 403
(a web page must not be able to drive the proxy from a browser).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Awaitable, Callable

from aiohttp import web
from pydantic import BaseModel, TypeAdapter, ValidationError

from chaos.proxy import errors
from chaos.proxy.collection import ProxyCollection
from chaos.proxy.metrics import render
from chaos.proxy.models import ProxyCreate, ProxyUpdate, ToxicCreate, ToxicUpdate, VersionInfo

log = logging.getLogger(__name__)

# The Toxiproxy release whose API this server implements; the suffix names the implementation.
VERSION = "2.9.0-kvchaos"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_populate_body = TypeAdapter(list[ProxyCreate])


def _json(data: Any, status: int = 200) -> web.Response:
    if isinstance(data, BaseModel):
        data = data.model_dump(mode="json")
    return web.json_response(data, status=status)


def _error(err: errors.ApiError) -> web.Response:
    return _json(err.body(), status=err.status)


@web.middleware
async def _api_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.headers.get("User-Agent", "").startswith("Mozilla/"):
        return web.Response(status=403, text="User agent not allowed\n")
    try:
        return await handler(request)
    except errors.ApiError as err:
        return _error(err)
    except web.HTTPException:
        raise
    except Exception as exc:  # keep serving; report like Toxiproxy's untyped errors
        log.exception("%s %s failed", request.method, request.path)
        return _error(errors.ApiError(f"internal error: {exc}", 500))


#: How long a request body may take to arrive (s): Toxiproxy 2.9.0's API server has
#: ``ReadTimeout: 15 * time.Second`` (api.go); a client that stalls mid-body is cut off.
BODY_READ_TIMEOUT_S = 15.0


async def _body(request: web.Request, model: Any) -> Any:
    try:
        raw = await asyncio.wait_for(request.read(), BODY_READ_TIMEOUT_S)
    except asyncio.TimeoutError:
        # As the real server: 503, and the connection closed (the body was not read to its end).
        raise web.HTTPServiceUnavailable(text="request body not received in time\n") from None
    try:
        if isinstance(model, TypeAdapter):
            return model.validate_json(raw or b"null")
        return model.model_validate_json(raw or b"{}")
    except ValidationError as exc:
        bad_json = any(e["type"] == "json_invalid" for e in exc.errors())
        detail = f"invalid JSON: {exc.errors()[0]['msg']}" if bad_json else errors.describe(exc)
        raise errors.BAD_REQUEST_BODY.joined(detail) from None


class Api:
    """Request handlers over a :class:`ProxyCollection`."""

    def __init__(self, collection: ProxyCollection) -> None:
        self.collection = collection

    def app(self) -> web.Application:
        """Return the aiohttp application with every route."""
        app = web.Application(middlewares=[_api_errors])
        r = app.router
        r.add_post("/reset", self.reset)
        r.add_get("/proxies", self.proxy_index)
        r.add_post("/proxies", self.proxy_create)
        r.add_post("/populate", self.populate)
        r.add_get("/proxies/{proxy}", self.proxy_show)
        r.add_post("/proxies/{proxy}", self.proxy_update)
        r.add_patch("/proxies/{proxy}", self.proxy_update)
        r.add_delete("/proxies/{proxy}", self.proxy_delete)
        r.add_get("/proxies/{proxy}/toxics", self.toxic_index)
        r.add_post("/proxies/{proxy}/toxics", self.toxic_create)
        r.add_get("/proxies/{proxy}/toxics/{toxic}", self.toxic_show)
        r.add_post("/proxies/{proxy}/toxics/{toxic}", self.toxic_update)
        r.add_patch("/proxies/{proxy}/toxics/{toxic}", self.toxic_update)
        r.add_delete("/proxies/{proxy}/toxics/{toxic}", self.toxic_delete)
        r.add_get("/version", self.version)
        r.add_get("/metrics", self.metrics)
        return app

    async def reset(self, request: web.Request) -> web.Response:
        """POST /reset: enable every proxy, remove every toxic; 204."""
        await self.collection.reset()
        return web.Response(status=204)

    async def proxy_index(self, request: web.Request) -> web.Response:
        """GET /proxies: 200 ``{name: proxy}``."""
        return _json({name: p.info().model_dump(mode="json")
                      for name, p in self.collection.proxies.items()})

    async def proxy_create(self, request: web.Request) -> web.Response:
        """POST /proxies: 201 proxy; 400 bad body, 409 exists, 500 listen failed."""
        spec = await _body(request, ProxyCreate)
        proxy = await self.collection.add(spec)
        return _json(proxy.info(), status=201)

    async def populate(self, request: web.Request) -> web.Response:
        """POST /populate: 201 ``{"proxies": [...]}``; on error the error plus the proxies done."""
        specs = await _body(request, _populate_body)
        proxies, err = await self.collection.populate(specs)
        body: dict[str, Any] = {"proxies": [p.info().model_dump(mode="json") for p in proxies]}
        if err is not None:
            return _json({**err.body(), **body}, status=err.status)
        return _json(body, status=201)

    async def proxy_show(self, request: web.Request) -> web.Response:
        """GET /proxies/{proxy}: 200 proxy; 404."""
        return _json(self.collection.get(request.match_info["proxy"]).info())

    async def proxy_update(self, request: web.Request) -> web.Response:
        """POST|PATCH /proxies/{proxy}: 200 proxy; 400, 404, 500 listen failed."""
        proxy = self.collection.get(request.match_info["proxy"])
        spec = await _body(request, ProxyUpdate)
        await proxy.update(spec.listen, spec.upstream, spec.enabled)
        return _json(proxy.info())

    async def proxy_delete(self, request: web.Request) -> web.Response:
        """DELETE /proxies/{proxy}: 204; 404."""
        self.collection.remove(request.match_info["proxy"])
        return web.Response(status=204)

    async def toxic_index(self, request: web.Request) -> web.Response:
        """GET /proxies/{proxy}/toxics: 200 ``[toxic]``; 404."""
        proxy = self.collection.get(request.match_info["proxy"])
        return _json([w.info().model_dump(mode="json") for w in proxy.toxics.all()])

    async def toxic_create(self, request: web.Request) -> web.Response:
        """POST /proxies/{proxy}/toxics: 200 toxic; 400, 404, 409."""
        proxy = self.collection.get(request.match_info["proxy"])
        spec = await _body(request, ToxicCreate)
        return _json(proxy.toxics.add(spec).info())

    async def toxic_show(self, request: web.Request) -> web.Response:
        """GET /proxies/{proxy}/toxics/{toxic}: 200 toxic; 404."""
        proxy = self.collection.get(request.match_info["proxy"])
        return _json(proxy.toxics.get(request.match_info["toxic"]).info())

    async def toxic_update(self, request: web.Request) -> web.Response:
        """POST|PATCH /proxies/{proxy}/toxics/{toxic}: 200 toxic; 400, 404."""
        proxy = self.collection.get(request.match_info["proxy"])
        proxy.toxics.get(request.match_info["toxic"])  # 404 before the body, as Toxiproxy
        spec = await _body(request, ToxicUpdate)
        return _json(proxy.toxics.update(request.match_info["toxic"], spec).info())

    async def toxic_delete(self, request: web.Request) -> web.Response:
        """DELETE /proxies/{proxy}/toxics/{toxic}: 204 once the toxic's resets already under way
        are done (``reset_peer``, as Toxiproxy 2.9.0); 404."""
        proxy = self.collection.get(request.match_info["proxy"])
        pending = proxy.toxics.remove(request.match_info["toxic"])
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        return web.Response(status=204)

    async def version(self, request: web.Request) -> web.Response:
        """GET /version: 200 ``{"version": ...}``."""
        return web.Response(text=json.dumps(VersionInfo(version=VERSION).model_dump()) + "\n",
                            content_type="application/json", charset="utf-8")

    async def metrics(self, request: web.Request) -> web.Response:
        """GET /metrics: 200 Prometheus text (names in :mod:`chaos.proxy.metrics`)."""
        return web.Response(body=render(self.collection.stats),
                            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})
