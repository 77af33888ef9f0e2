"""The service that joins the engine to Kafka (jobs in) and Redis (tokens out)."""
