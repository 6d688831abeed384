"""Cluster stage: graphs of GPUs, switches and links; routing; placement and process groups."""

from simulator.cluster.builders import NODE_BUILDERS, build_cluster
from simulator.cluster.fabrics import FABRICS, Fabric, register_fabric
from simulator.cluster.graph import ClusterGraph, Link, Vertex
from simulator.cluster.mesh import Mesh
from simulator.cluster.routing import Route, Router

# the fabric registry under its earlier name (kind -> Fabric class, builder and router in one)
FABRIC_BUILDERS = FABRICS

__all__ = ["build_cluster", "ClusterGraph", "Link", "Vertex", "Mesh", "Route", "Router", "NODE_BUILDERS",
           "FABRIC_BUILDERS", "FABRICS", "Fabric", "register_fabric"]
