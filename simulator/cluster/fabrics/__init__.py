"""Scale-out fabrics: one module per family, each kind registered under its ``fabric.kind`` tag.

Importing this package registers the built-in kinds (fat-tree, rail-optimized, single-switch,
torus). A fabric from outside the package registers itself the same way::

    from simulator.cluster.fabrics import Fabric, register_fabric

    @register_fabric("my-fabric")
    class MyFabric(Fabric):
        def build(self, cluster): ...
        def paths(self, cluster, src, dst, flow, seed): ...
"""

from simulator.cluster.fabrics import leaf_spine, torus
from simulator.cluster.fabrics.base import (
    FABRICS,
    Fabric,
    FabricPath,
    NicRef,
    add_nic_link,
    build_fabric,
    nic_params,
    register_fabric,
)

__all__ = ["FABRICS", "Fabric", "FabricPath", "NicRef", "register_fabric", "build_fabric", "nic_params",
           "add_nic_link", "leaf_spine", "torus"]
