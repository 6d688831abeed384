"""Cluster stage: graphs of GPUs, switches and links; routing; placement and process groups."""

from simulator.cluster.builders import FABRIC_BUILDERS, NODE_BUILDERS, build_cluster
from simulator.cluster.graph import ClusterGraph, Link, Vertex
from simulator.cluster.mesh import Mesh
from simulator.cluster.routing import Route, Router

__all__ = ["build_cluster", "ClusterGraph", "Link", "Vertex", "Mesh", "Route", "Router", "NODE_BUILDERS",
           "FABRIC_BUILDERS"]
