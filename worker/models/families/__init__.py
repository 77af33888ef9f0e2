"""One module per decoder family: the architectures it serves and how its config maps
to the shared layers' traits (``worker.models.traits``)."""
