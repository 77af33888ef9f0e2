"""Reserved: filled by its own issue."""
