"""The detector service's HTTP side: the Flask app factory, its routes, request schemas, the WSGI/ASGI entry and the paste page."""
