#!/usr/bin/env bash
# A Spark standalone master and one worker on 127.0.0.1, from the installed pyspark package
# (its sbin/spark-daemon.sh with the Master and Worker classes), for running
# `vrepl validate --master spark://127.0.0.1:PORT` or spark-submit against a real cluster.
#
#   tools/spark_cluster.sh start [--dir DIR] [--port PORT] [--cores N] [--memory 1g]
#   tools/spark_cluster.sh stop  [--dir DIR]
#   tools/spark_cluster.sh status [--dir DIR]
#
# start prints the master URL (spark://127.0.0.1:PORT) on stdout once the worker has
# registered. PIDs, logs and the worker's scratch space live in DIR (default
# $VREPL_SPARK_DIR or /tmp/vrepl-spark-cluster-$UID); stop kills exactly those PIDs
# (TERM, then KILL after 10 s) and never anything found by name. Everything binds to
# 127.0.0.1; the master and worker web UIs take a free port on 127.0.0.1.
set -euo pipefail

cmd=${1:-}
[ -n "$cmd" ] && shift
dir=${VREPL_SPARK_DIR:-/tmp/vrepl-spark-cluster-$(id -u)}
port=${SPARK_MASTER_PORT:-7077}
cores=2
memory=1g
while [ $# -gt 0 ]; do
  case "$1" in
    --dir) dir=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --cores) cores=$2; shift 2 ;;
    --memory) memory=$2; shift 2 ;;
    *) echo "spark_cluster.sh: unknown option $1" >&2; exit 2 ;;
  esac
done

die() { echo "spark_cluster.sh: $*" >&2; exit 2; }

python=${PYSPARK_PYTHON:-$(command -v python3 || command -v python)}
spark_home() {
  "$python" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))' 2>/dev/null \
    || die "pyspark is not installed for $python (python3 -m pip install pyspark)"
}

export SPARK_LOCAL_IP=127.0.0.1 SPARK_MASTER_HOST=127.0.0.1 SPARK_PUBLIC_DNS=127.0.0.1
export SPARK_LOG_DIR="$dir/logs" SPARK_PID_DIR="$dir/pids" SPARK_WORKER_DIR="$dir/work"
unset SPARK_NO_DAEMONIZE
export SPARK_IDENT_STRING=vrepl PYSPARK_PYTHON="$python"
export SPARK_MASTER_OPTS="${SPARK_MASTER_OPTS:-} -Dspark.master.rest.enabled=false"

alive() { [ -n "${1:-}" ] && kill -0 "$1" 2>/dev/null; }
pid_of() { cat "$dir/$1.pid" 2>/dev/null || true; }

stop_pid() {   # $1 = name; kill the recorded PID only
  local pid; pid=$(pid_of "$1")
  if alive "$pid"; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do alive "$pid" || break; sleep 0.1; done
    if alive "$pid"; then kill -9 "$pid" 2>/dev/null || true; fi
    echo "stopped $1 (pid $pid)" >&2
  fi
  rm -f "$dir/$1.pid"
}

case "$cmd" in
  start)
    command -v java >/dev/null 2>&1 || [ -x "${JAVA_HOME:-/nonexistent}/bin/java" ] \
      || die "Java is not installed (Spark needs Java 17+: apt-get install openjdk-17-jre-headless)"
    sh=$(spark_home)
    mkdir -p "$SPARK_LOG_DIR" "$SPARK_PID_DIR" "$SPARK_WORKER_DIR"
    if alive "$(pid_of master)"; then die "a master is already running from $dir (pid $(pid_of master)); stop it first"; fi
    url="spark://127.0.0.1:$port"
    # spark-daemon.sh writes its own pid file under SPARK_PID_DIR; we copy the PID to
    # $dir/<name>.pid, which is what stop uses.
    "$sh/sbin/spark-daemon.sh" start org.apache.spark.deploy.master.Master 1 \
      --host 127.0.0.1 --port "$port" --webui-port 0 >/dev/null
    cp "$SPARK_PID_DIR/spark-vrepl-org.apache.spark.deploy.master.Master-1.pid" "$dir/master.pid"
    for _ in $(seq 1 300); do
      grep -q "I have been elected leader\|Starting Spark master at" "$SPARK_LOG_DIR"/*Master*.out 2>/dev/null && break
      alive "$(pid_of master)" || { tail -5 "$SPARK_LOG_DIR"/*Master*.out >&2; die "the master did not start (log: $SPARK_LOG_DIR)"; }
      sleep 0.1
    done
    "$sh/sbin/spark-daemon.sh" start org.apache.spark.deploy.worker.Worker 1 \
      --host 127.0.0.1 --webui-port 0 --cores "$cores" --memory "$memory" \
      --work-dir "$SPARK_WORKER_DIR" "$url" >/dev/null
    cp "$SPARK_PID_DIR/spark-vrepl-org.apache.spark.deploy.worker.Worker-1.pid" "$dir/worker.pid"
    for _ in $(seq 1 300); do
      grep -q "Successfully registered with master" "$SPARK_LOG_DIR"/*Worker*.out 2>/dev/null && break
      alive "$(pid_of worker)" || { tail -5 "$SPARK_LOG_DIR"/*Worker*.out >&2; stop_pid master; die "the worker did not start (log: $SPARK_LOG_DIR)"; }
      sleep 0.1
    done
    grep -q "Successfully registered with master" "$SPARK_LOG_DIR"/*Worker*.out 2>/dev/null \
      || { stop_pid worker; stop_pid master; die "the worker did not register within 30 s (log: $SPARK_LOG_DIR)"; }
    echo "$url" > "$dir/master.url"
    echo "$url"
    ;;
  stop)
    stop_pid worker
    stop_pid master
    rm -f "$dir/master.url"
    ;;
  status)
    for n in master worker; do
      pid=$(pid_of $n)
      if alive "$pid"; then echo "$n running (pid $pid)"; else echo "$n not running"; fi
    done
    [ -f "$dir/master.url" ] && cat "$dir/master.url"
    ;;
  *)
    echo "usage: $0 start|stop|status [--dir DIR] [--port PORT] [--cores N] [--memory SIZE]" >&2
    exit 2 ;;
esac
