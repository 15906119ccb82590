# offcpu-exporter: the image the Helm chart (helm/offcpu-exporter) runs on every node.
#   docker build -t offcpu-exporter:0.1.0 .
# bcc compiles the probe at start against the node's kernel headers, which the chart mounts read-only
# from the host (/lib/modules, /usr/src); the image carries bcc and clang's runtime, not headers.
FROM debian:12-slim

ARG DEBIAN_FRONTEND=noninteractive
# Debian's bcc (python3-bpfcc, libbpfcc): PyPI's "bcc" is an unrelated package.
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-bpfcc libbpfcc ca-certificates \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/offcpu-exporter
COPY pyproject.toml constraints.txt README.md LICENSE NOTICE ./
# The Python source root and the BPF C sources (bpf/, compiled by bcc at start), which the install puts
# inside the package (bpf/).
COPY exporter/ exporter/
COPY bpf/ bpf/

# A virtualenv on the system interpreter that sees Debian's bcc module (pod names need no extra: the
# exporter's own small API client). A plain (not editable) install: the source tree is removed after.
# constraints.txt pins every runtime dependency to the tested version, so a rebuild gets the same image.
RUN python3 -m venv --system-site-packages /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir -c constraints.txt /opt/offcpu-exporter \
 && cd / && rm -rf /opt/offcpu-exporter \
 && /opt/venv/bin/python -c 'import bcc, offcpu_exporter.cli'
WORKDIR /

ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# Root in the container, but with only the capabilities the chart grants (see docs/kubernetes.md).
USER 0
EXPOSE 9961
ENTRYPOINT ["offcpu-exporter"]
CMD ["serve"]
