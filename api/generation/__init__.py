"""The generation service's HTTP side: the Flask app factory, its routes (provmark's own API and the OpenAI-compatible one) and the engine worker thread."""
