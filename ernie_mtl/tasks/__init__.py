"""Built-in task types (importing this package registers them); see ernie_mtl/tasks/base.py for the
contract and ernie_mtl/tasks/feeds.py for the feeds a task type produces."""
from ernie_mtl.tasks.base import (  # noqa: F401
    Encoded, HeadOutputs, Option, TaskContext, TaskData, TaskSpec, TaskType, get_task_type, register_task_type,
    registered_task_types)
from ernie_mtl.tasks import classification, mlm, mrc, pretrain, seq_label  # noqa: F401,E402
