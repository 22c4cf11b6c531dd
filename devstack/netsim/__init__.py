"""Hosts in network namespaces, their links, latency and cuts."""
