# The real Toxiproxy as an image, built with no registry: the static toxiproxy-server binary
# (KVCHAOS_TOXIPROXY_BIN, e.g. ../shared/tools/toxiproxy/toxiproxy-server) copied into a
# temporary build context next to this file at build time (never committed), on an empty base.
# Same entrypoint as Shopify's image (ghcr.io/shopify/toxiproxy): /toxiproxy, flags as command.
#
#   .venv/bin/python -c 'from chaos.stack.compose import build_toxiproxy_image; print(build_toxiproxy_image())'
#   (scripts/build-image.sh does it; the compose backend does it when --proxy real needs it)
FROM scratch
COPY toxiproxy-server /toxiproxy
LABEL org.opencontainers.image.title="toxiproxy (kvchaos offline build)" \
      io.kvchaos.role="toxiproxy"
EXPOSE 8474
ENTRYPOINT ["/toxiproxy"]
CMD ["-host=0.0.0.0"]
