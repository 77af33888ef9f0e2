"""The HTTP API: jobs in over HTTP (``/v1/jobs`` and the OpenAI routes) onto Kafka,
tokens back from Redis as SSE. Imports no torch and nothing of ``worker/``."""
