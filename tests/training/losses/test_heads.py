"""AnchorHead layout, anchors() and ONNX export of head + read-outs."""

import pytest
import torch

from scehr.training.heads import AnchorHead
from scehr.training.losses import BCE, CBCE, CSCE


def test_layout_u_at_index_0_v_at_index_1() -> None:
    head = AnchorHead(dim=4, n_classes=3)
    assert head.linear.bias is None
    z = torch.randn(5, 4)
    w = head.linear.weight.detach().view(3, 2, 4)
    logits = head(z)
    assert logits.shape == (5, 3, 2)
    for c in range(3):
        torch.testing.assert_close(logits[:, c, 0], z @ w[c, 0])
        torch.testing.assert_close(logits[:, c, 1], z @ w[c, 1])


def test_anchors_are_detached_copies() -> None:
    head = AnchorHead(dim=3, n_classes=2)
    u, v = head.anchors()
    assert u.shape == v.shape == (2, 3)
    assert not u.requires_grad and not v.requires_grad
    w = head.linear.weight.detach().view(2, 2, 3)
    torch.testing.assert_close(u, w[:, 0])
    torch.testing.assert_close(v, w[:, 1])
    u += 1.0
    torch.testing.assert_close(head.anchors()[0], w[:, 0])


def test_onnx_export_matches_pytorch() -> None:
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.head = AnchorHead(4, 3)

        def forward(self, z: torch.Tensor) -> tuple[torch.Tensor, ...]:
            a = self.head(z)
            return a, CBCE.probability(a), CSCE.probability(a), BCE.probability(a)

    model = Model().eval()
    program = torch.onnx.export(
        model,
        (torch.randn(2, 4),),
        dynamic_shapes={"z": {0: torch.export.Dim("batch")}},
        dynamo=True,
        verbose=False,
    )
    session = ort.InferenceSession(
        program.model_proto.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    for batch in (1, 6):
        z = torch.randn(batch, 4)
        outputs = session.run(None, {session.get_inputs()[0].name: z.numpy()})
        for got, want in zip(outputs, model(z), strict=True):
            torch.testing.assert_close(torch.from_numpy(got), want.detach(), atol=1e-5, rtol=1e-5)
