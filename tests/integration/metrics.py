"""Reading a process's Prometheus page in tests."""

import httpx
from prometheus_client.parser import text_string_to_metric_families


def _samples(url: str):
    page = httpx.get(f"{url}/metrics", timeout=5).text
    for family in text_string_to_metric_families(page):
        yield from family.samples


def sample(url: str, name: str, **labels: str) -> float:
    """One sample (0 when the series is not there yet); labels not named match anything."""
    for found in _samples(url):
        if found.name == name and labels.items() <= found.labels.items():
            return found.value
    return 0.0


def total(url: str, name: str) -> float:
    """The sum of a metric's samples over all its labels."""
    return sum(found.value for found in _samples(url) if found.name == name)
