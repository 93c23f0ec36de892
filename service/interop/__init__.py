"""Standard interfaces over the same scoring path: FHIR R4, CDS Hooks, Open Inference Protocol."""
