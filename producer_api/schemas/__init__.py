"""Request and response bodies of the routes (the wire's messages are ``queue_schemas``)."""
