"""Where the API keeps state: jobs and batches in Redis, files on a shared folder."""
