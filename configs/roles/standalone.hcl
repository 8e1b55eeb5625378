# CapyCTL standalone role configuration.
#
# Every setting is listed with its default, commented out: uncomment a line
# to change it. A value can also come from an environment variable (named
# beside each setting) or a flag; a flag wins over the variable, which wins
# over this file. "capyctl config show" prints each value and its source.

# The role this configuration runs.
# (env CAPYCTL_ROLE; one of standalone, server, host)
role = "standalone"

# Where the store, engine logs and runtime files live (created 0700).
# Default: $XDG_STATE_HOME/capyctl, else ~/.local/state/capyctl.
# (env CAPYCTL_STATE_DIR)
# state_dir = "~/.local/state/capyctl"

# The inference endpoint's address (the API key is always required); a host's own endpoint is on loopback by default, since the server reaches the host over the host's own connection.
# Default: 0.0.0.0:8443; 127.0.0.1:8443 on a host.
# (env CAPYCTL_LISTEN)
# listen = "0.0.0.0:8443"

# The management API's address; loopback only.
# (env CAPYCTL_MANAGEMENT_LISTEN)
# management_listen = "127.0.0.1:7443"

# Where third-party drivers (capyctl-driver-<name>) are found.
# Default: <state_dir>/plugins.
# (env CAPYCTL_PLUGIN_DIR)
# plugin_dir = "~/.local/state/capyctl/plugins"

# The model store: relative model paths and Hugging Face downloads live here.
# (env CAPYCTL_MODELS_ROOT)
# models_root = "~/models"

# Loopback ports leased to engines, first-last.
# (env CAPYCTL_ENGINE_PORTS)
# engine_ports = "8100-8199"

# This machine's name in the state; a change is refused (host_name_changed).
# Default: the machine's hostname.
# (env CAPYCTL_HOSTNAME)
# hostname = "gpu-a"

# The role's log level.
# (env CAPYCTL_LOG_LEVEL; one of trace, debug, info, warn, error)
# log_level = "info"

# Text on a terminal and JSON lines otherwise (auto), or always one.
# (env CAPYCTL_LOG_FORMAT; one of auto, text, json)
# log_format = "auto"

# Off gives every engine DO_NOT_TRACK=1 (and vLLM's own opt-outs); allow leaves them out.
# (env CAPYCTL_ENGINE_TELEMETRY; one of off, allow)
# engine_telemetry = "off"

# Engine output to <state_dir>/logs (file) or the last 4 MiB per launch in memory only.
# (env CAPYCTL_ENGINE_LOGS; one of file, memory)
# engine_logs = "file"

# Off runs no LMCache for any deployment on this host; auto leaves it to each deployment's lmcache.
# (env CAPYCTL_LMCACHE; one of auto, off)
# lmcache = "auto"

# Zero keeps engine logs in memory, writes no core dumps and starts no LMCache.
# (env CAPYCTL_RETENTION; one of standard, zero)
# retention = "standard"

gpu {
  # GPU inventory: NVML when present (auto), NVML, the simulated GPU, or none.
  # (env CAPYCTL_GPU_PROVIDER; one of auto, nvml, simulated, none)
  # provider = "auto"

  # The simulated GPU's shared state file (empty: in memory).
  # (env CAPYCTL_GPU_SIM_STATE)
  # sim_state = ""

  # Number of simulated GPUs.
  # (env CAPYCTL_GPU_SIM_DEVICES)
  # sim_devices = 1

  # Memory of each simulated GPU.
  # (env CAPYCTL_GPU_SIM_DEVICE_MEMORY)
  # sim_device_memory = "24GiB"

  # Simulate one unified memory pool instead of discrete cards.
  # (env CAPYCTL_GPU_SIM_UNIFIED)
  # sim_unified = false
}

memory {
  system {
    # Host RAM CapyCTL may charge: auto (50%), a size or a percentage.
    # (env CAPYCTL_MEMORY_SYSTEM_MANAGED_LIMIT)
    # managed_limit = "auto"

    # Host RAM always left free: auto (20%), a size or a percentage.
    # (env CAPYCTL_MEMORY_SYSTEM_FREE_RESERVE)
    # free_reserve = "auto"
  }

  gpu {
    # Card memory CapyCTL may charge, per card: auto (derived), a size or a percentage.
    # (env CAPYCTL_MEMORY_GPU_MANAGED_LIMIT)
    # managed_limit = "auto"

    # Card memory always left free, per card: auto (derived), a size or a percentage.
    # (env CAPYCTL_MEMORY_GPU_FREE_RESERVE)
    # free_reserve = "auto"
  }
}

lifecycle_defaults {
  # Park (or stop) a ready model idle this long, for deployments that do not say; empty: off.
  # (env CAPYCTL_LIFECYCLE_DEFAULTS_READY_IDLE_TIMEOUT)
  # ready_idle_timeout = ""

  # Stop a parked model idle this long, for deployments that do not say; empty: off.
  # (env CAPYCTL_LIFECYCLE_DEFAULTS_PARKED_IDLE_TIMEOUT)
  # parked_idle_timeout = ""
}

switching {
  # What a request does when its model must wait for busy models to leave the card: turns (it waits for their turns; served in batches, victims by expected cost) or immediate (it is refused at once with capacity_blocked, the policy before turns).
  # (env CAPYCTL_SWITCHING_POLICY; one of turns, immediate)
  # policy = "turns"

  # How long a busy model keeps its turn once another model waits for its memory, counted from that model's longest-waiting request.
  # (env CAPYCTL_SWITCHING_TURN_TIME)
  # turn_time = "30s"

  # How many more requests a busy model admits once another model waits for its memory; 0: no bound but switching.turn_time.
  # (env CAPYCTL_SWITCHING_TURN_REQUESTS)
  # turn_requests = 0
}

limits {
  # How often a streamed request that waits (for a place, a wake, a start or another model's turn) gets an SSE progress comment, which keeps proxies and clients that time out on silence from cutting it.
  # (env CAPYCTL_LIMITS_PROGRESS_INTERVAL)
  # progress_interval = "10s"

  # Requests waiting for a place, all deployments together.
  # (env CAPYCTL_LIMITS_MAX_WAITING_TOTAL)
  # max_waiting_total = 256

  # Bytes of waiting request bodies, all together.
  # (env CAPYCTL_LIMITS_MAX_WAITING_BYTES)
  # max_waiting_bytes = "64MiB"

  # A request's bound until its first output, for deployments that do not say.
  # (env CAPYCTL_LIMITS_REQUEST_DEADLINE)
  # request_deadline = "600s"

  # The largest request body (413 request_too_large above).
  # (env CAPYCTL_LIMITS_MAX_BODY_BYTES)
  # max_body_bytes = "64MiB"

  # Request bodies held in memory, all together: being received, waiting or on their way to the engine (429 bodies_in_flight_full above).
  # (env CAPYCTL_LIMITS_MAX_BODY_BYTES_IN_FLIGHT)
  # max_body_bytes_in_flight = "256MiB"
}

listener {
  # The time a client may take to send a request's head, the first one of a new connection included.
  # (env CAPYCTL_LISTENER_READ_HEADER_TIMEOUT)
  # read_header_timeout = "10s"

  # A kept-alive connection that sends no next request this long is closed.
  # (env CAPYCTL_LISTENER_IDLE_TIMEOUT)
  # idle_timeout = "60s"

  # The time a whole request body may take to arrive (408 body_read_timeout above; the connection is closed).
  # (env CAPYCTL_LISTENER_BODY_READ_TIMEOUT)
  # body_read_timeout = "60s"

  # Open connections per listener (inference, management); more are closed at once; 0: no cap.
  # (env CAPYCTL_LISTENER_MAX_CONNECTIONS)
  # max_connections = 4096

  # Connections of one client address that carried no authenticated request yet; 0: no cap (behind a reverse proxy all clients share the proxy's address).
  # (env CAPYCTL_LISTENER_MAX_UNAUTHENTICATED_PER_ADDRESS)
  # max_unauthenticated_per_address = 512

  # Failed inference authentications one client address may make per minute (a burst of as many); past it the address is answered 429 rate_limited until its allowance refills; 0: no bound (behind a reverse proxy all clients share the proxy's address).
  # (env CAPYCTL_LISTENER_AUTH_FAILURES_PER_MINUTE)
  # auth_failures_per_minute = 30
}

tls {
  # The inference endpoint's certificate (PEM, chain included); empty: plain HTTP; read again when the file changes.
  # (env CAPYCTL_TLS_CERT_FILE)
  # cert_file = ""

  # The private key of tls.cert_file (PEM).
  # (env CAPYCTL_TLS_KEY_FILE)
  # key_file = ""

  # CA certificates (PEM) that sign the clients' certificates; set: every client must present one.
  # (env CAPYCTL_TLS_CLIENT_CA_FILE)
  # client_ca_file = ""
}

shutdown {
  # How long a stopping role lets running requests finish.
  # (env CAPYCTL_SHUTDOWN_DRAIN_TIMEOUT)
  # drain_timeout = "30s"
}

drivers {
  # Bound of a quick driver call (describe, flags, load, logs, abort, liveness probe; a readiness probe adds its own wait).
  # (env CAPYCTL_DRIVERS_CALL_TIMEOUT)
  # call_timeout = "15s"

  # Bound of a driver's plan, detect and recover calls.
  # (env CAPYCTL_DRIVERS_PLAN_TIMEOUT)
  # plan_timeout = "1m"

  # Bound of a driver's start call (spawning the engine; readiness has its own startup timeout).
  # (env CAPYCTL_DRIVERS_START_TIMEOUT)
  # start_timeout = "2m"

  # Bound of a driver's park and wake calls.
  # (env CAPYCTL_DRIVERS_PARK_TIMEOUT)
  # park_timeout = "5m"

  # Bound of a driver's stop call, on top of the engine's grace period.
  # (env CAPYCTL_DRIVERS_STOP_TIMEOUT)
  # stop_timeout = "30s"

  # How often every driver is pinged; one that misses two pings in a row is killed and relaunched.
  # (env CAPYCTL_DRIVERS_PING_INTERVAL)
  # ping_interval = "5s"

  # Bound of one driver ping.
  # (env CAPYCTL_DRIVERS_PING_TIMEOUT)
  # ping_timeout = "5s"
}

request_ledger {
  # Keep a record per request (outcome, timings, bytes; never prompts).
  # (env CAPYCTL_REQUEST_LEDGER_ENABLED)
  # enabled = true

  # How long request records are kept (7d works too).
  # (env CAPYCTL_REQUEST_LEDGER_RETENTION)
  # retention = "168h"

  # How many request records are kept.
  # (env CAPYCTL_REQUEST_LEDGER_MAX_RECORDS)
  # max_records = 100000
}

responses {
  # How long the Responses API keeps a stored response (store: true) for previous_response_id and GET /v1/responses/{id}; 0 keeps none.
  # (env CAPYCTL_RESPONSES_RETENTION)
  # retention = "720h"

  # The stored responses' bound, all together: the oldest go first.
  # (env CAPYCTL_RESPONSES_MAX_BYTES)
  # max_bytes = "1GiB"
}

usage {
  # How long the API keys' usage (per key, model and hour) is kept; 90 days by default, and at least as long as the monthly budgets need (a month).
  # (env CAPYCTL_USAGE_RETENTION)
  # retention = "2160h"
}
