"""Hand-built TrainingGraphs for tests of the planner, validator and simulator."""

from autotm.ir.graph import Kernel, Role, Tensor, TrainingGraph, check


def make_graph(sizes, kernels, *, names=None, roles=None, ops=None, outputs=(), name="g", program=None) -> TrainingGraph:
    """A TrainingGraph from lists: `sizes[t]` bytes of tensor t, `kernels[k] = (inputs, outputs)`.

    A tensor no kernel writes is a graph input (Role.INPUT unless `roles` says otherwise); a
    produced one is an ACTIVATION unless `roles` says otherwise. `outputs` are graph
    outputs (live to the last kernel).
    """
    roles = dict(roles or {})
    producer = {t: k for k, (_, outs) in enumerate(kernels) for t in outs}
    users: dict[int, list[int]] = {t: [] for t in range(len(sizes))}
    for k, (ins, _) in enumerate(kernels):
        for t in ins:
            users[t].append(k)
    n = len(kernels)
    tensors = []
    for t, nb in enumerate(sizes):
        p = producer.get(t)
        first = 0 if p is None else p
        last = n - 1 if t in outputs else max([first] + users[t])
        role = roles.get(t, Role.INPUT if p is None else Role.ACTIVATION)
        tensors.append(Tensor(id=t, name=names[t] if names else f"t{t}", nbytes=nb, dtype="float32", shape=(nb // 4,),
                              stride=(1,), role=role, producer=p, users=tuple(users[t]), live=(first, last),
                              is_graph_output=t in outputs))
    ks = tuple(Kernel(index=k, op=ops[k] if ops else f"op{k}", inputs=tuple(ins), outputs=tuple(outs),
                      signature=f"{ops[k] if ops else 'op'}{k}", flops=0, bytes_touched=0, module="", phase="forward")
               for k, (ins, outs) in enumerate(kernels))
    g = TrainingGraph(name=name, kernels=ks, tensors=tuple(tensors), parameters=0, program=program)
    check(g)
    return g
