"""A TCP fault proxy that speaks Toxiproxy 2.x's REST API (``kvchaos proxy serve``).

kvchaos drives network faults through "a Toxiproxy": the real one where it can be installed,
this one where it cannot. Both are driven by :class:`chaos.proxy.client.ToxiproxyClient`.

The pipeline, per client connection (see :mod:`chaos.proxy.link`)::

                 upstream link: [toxic stub] -> [toxic stub] -> ...
    client  <==>  proxy  ======================================>  upstream server
                        <======================================
                 downstream link: [toxic stub] -> [toxic stub] -> ...

Modules: ``server`` (API + proxies in one asyncio loop), ``api`` (routes), ``collection``
(proxies by name), ``proxy`` (listener), ``connection`` (socket pair), ``link`` (one direction
and its toxic chain), ``toxic_collection`` (a proxy's toxics), ``toxics/`` (one module per
toxic type), ``metrics`` (/metrics names), ``models`` (API JSON), ``errors`` (API errors),
``client`` (the HTTP client), ``cli`` (``kvchaos proxy serve``).
"""
