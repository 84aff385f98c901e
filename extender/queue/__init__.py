"""Horus's weighted-fair queue (TPDS'21 §4.2.2, Algorithm 1 lines 1-4).

``fair`` is the pure queue: k-means (L1) classes of pending jobs, per-class
weights ``w_x = max(len, median_wait * len)``, ``beta`` releases per round and a
starvation guard. ``gate`` is the Kubernetes controller that holds GPU pods
behind the ``tandem.io/queue`` scheduling gate and releases them in the order the
queue picks; ``metrics`` exports what each round saw to Prometheus. ``tandem
simulate`` drives the same ``fair`` code with a virtual clock. Importing this
package does not import ``kubernetes``.
"""

from extender.queue.fair import (
    FairQueue,
    QueueConfig,
    QueueError,
    QueueItem,
    apportion,
    cluster_l1,
    queue_weights,
)

__all__ = [
    "FairQueue",
    "QueueConfig",
    "QueueError",
    "QueueItem",
    "apportion",
    "cluster_l1",
    "queue_weights",
]
