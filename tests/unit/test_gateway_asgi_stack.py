"""Nothing on the gateway's request path wraps each request in Starlette's ``BaseHTTPMiddleware``,
which runs the response through a second task and a memory stream (a streaming proxy's largest
cost where it is used): every layer from the server to a route is a pure ASGI app."""

from __future__ import annotations

from starlette.middleware.base import BaseHTTPMiddleware
from starlette.routing import Router

from coda.gateway.app import Gateway, create_app
from coda.gateway.config import GatewayConfig


def test_no_layer_of_the_request_path_is_a_base_http_middleware():
    app = create_app(Gateway(GatewayConfig(backends=["http://127.0.0.1:1"])))
    layers, layer = [], app.build_middleware_stack()
    while layer is not None:
        layers.append(layer)
        layer = getattr(layer, "app", None)
    assert any(isinstance(x, Router) for x in layers)  # the walk reached the routes
    assert not any(isinstance(x, BaseHTTPMiddleware) for x in layers)
