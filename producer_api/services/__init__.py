"""What the routes and the batch runner call: the fleet's connections and job submission
(``fleet``), runs of OpenAI requests (``runs``), event streams, limits and the backlog."""
