"""The Ray side of the controller's worker-group seam (``orchestrator.controller.seam``).

The controller decides with no Ray in sight; this package is what makes its decisions happen on
a Ray cluster, one module per thing: ``group`` (``RayWorkerGroup``, one JAX group of host
actors), ``factory`` (``RayGroups`` / ``ray_group_factory``, what a run's groups share),
``cluster_view`` (``RayClusterView``: nodes, slices, probes, ``spawn``), ``results`` (Ray
exceptions and host results to the seam's values, pure), ``runtime`` (joining the JAX group
under a bound), ``hangs`` (naming the hosts a bound caught), ``warm_pool`` (processes kept warm
across re-forms), ``ram_holders`` (the RAM tier's holder actors and the run's secret) and
``topology`` (Ray connection, node labels, the emulated cluster).
"""
