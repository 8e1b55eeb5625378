# One model across two machines: a vLLM group, one engine rank per host,
# tensor parallel over both cards. Only a server with hosts runs it (a
# standalone role refuses a topology); see the guide "One model across
# machines".
#
#   capyctl deploy --file configs/jobs/vllm-group.hcl --activate --wait
#   capyctl status deployment llama-70b
deployment "llama-70b" {
  engine = "vllm"

  # Ranks in this order: gpu-a runs the head (rank 0, the model's HTTP
  # API), gpu-b the worker (rank 1). At least two hosts, and
  # tensor_parallel × pipeline_parallel must divide by their number.
  placement {
    hosts = ["gpu-a", "gpu-b"]
  }

  topology {
    tensor_parallel   = 2 # over all machines, one card each
    pipeline_parallel = 1
  }

  model {
    # The same files at the same path on every host of the group.
    path = "Llama-3.3-70B-Instruct"
  }

  # vLLM groups park deep (the default); leave instances unset: a group
  # runs one instance across its hosts.
  residency = "deep"

  lifecycle {
    ready_idle_timeout = "30m"
  }
}
