"""The HTTP routes, one module per resource; each calls the services and stores below it."""
