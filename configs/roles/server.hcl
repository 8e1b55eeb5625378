# CapyCTL server role configuration.
#
# Every setting is listed with its default, commented out: uncomment a line
# to change it. A value can also come from an environment variable (named
# beside each setting) or a flag; a flag wins over the variable, which wins
# over this file. "capyctl config show" prints each value and its source.

# The role this configuration runs.
# (env CAPYCTL_ROLE; one of standalone, server, host)
role = "server"

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

# The address GPU hosts dial: joining, the host link and the relay, mutual TLS only.
# (env CAPYCTL_CLUSTER_LISTEN)
# cluster_listen = "0.0.0.0:8444"

# The address hosts are told to dial (join tokens print it, the server certificate names it).
# Default: cluster_listen, with this machine's name for 0.0.0.0.
# (env CAPYCTL_CLUSTER_ADVERTISE)
# cluster_advertise = "gpu-server.example.com:8444"

# The number of servers of the server cluster: the first server of a cluster starts with it (above 1 it bootstraps raft); until that many are voters the cluster says it is degraded; 1 is a server alone.
# (env CAPYCTL_BOOTSTRAP_EXPECT)
# bootstrap_expect = 1

# The cluster addresses of running servers this server joins, comma-separated: the first that answers is used, another one when it is out of reach (with a server join token: capyctl create join-token --role server).
# Default: none: this server is the first of its cluster, or alone.
# (env CAPYCTL_SERVER_JOIN)
# server_join = "s1.example.com:8444,s2.example.com:8444"

# The server adopts a deployment a host made itself (on its own management API, or before it joined): listed and routed under its own model names, never one another deployment serves; false: a host serves only what the servers placed on it (the trust model: a compromised host cannot publish a model name).
# (env CAPYCTL_ADOPT_HOST_DEPLOYMENTS)
# adopt_host_deployments = true

# How long the leader waits for a lost host before it places the host's instances on other hosts that fit (its old copies are stopped when it returns; a group stays down, the reason in its status); "0s" never moves them.
# (env CAPYCTL_RESCHEDULE_AFTER)
# reschedule_after = "5m"

# How long a group's bring-up may go without its head becoming ready before the group is stopped (group_stalled).
# (env CAPYCTL_GROUP_STALL_TIMEOUT)
# group_stall_timeout = "120s"

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

# Zero keeps engine logs in memory, writes no core dumps and starts no LMCache.
# (env CAPYCTL_RETENTION; one of standard, zero)
# retention = "standard"

# How often joined hosts send a heartbeat; a host silent for three is lost and its instances read uncertain.
# (env CAPYCTL_HOST_HEARTBEAT)
# host_heartbeat = "2s"

lifecycle_defaults {
  # Park (or stop) a ready model idle this long, for deployments that do not say; empty: off.
  # (env CAPYCTL_LIFECYCLE_DEFAULTS_READY_IDLE_TIMEOUT)
  # ready_idle_timeout = ""

  # Stop a parked model idle this long, for deployments that do not say; empty: off.
  # (env CAPYCTL_LIFECYCLE_DEFAULTS_PARKED_IDLE_TIMEOUT)
  # parked_idle_timeout = ""
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
