# TensorFold needs its memory declared: it is launched with
# TENSORFOLD_CUDA_MEMORY_LIMIT_GB set to the ready charge, and restarts
# instead of parking.
deployment "fold-chat" {
  engine    = "tensorfold"
  residency = "restart_only"

  model {
    path = "/srv/models/fold-14b"
  }

  resources {
    startup {
      gpu = "22GiB"
      ram = "6GiB"
    }
    ready {
      gpu = "20GiB"
      ram = "4GiB"
    }
  }

  # A cold start compiles kernels; give it time.
  timeouts {
    initialize = "30m"
  }
  request_deadline = "1800s"

  engine_config {
    max_concurrent_requests = 8
    context_length          = 16384

    tensorfold {
      max_tokens = 4096
      thinking   = false
    }
  }
}
