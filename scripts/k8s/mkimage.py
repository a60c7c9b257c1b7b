"""mkimage.py ROOTFS NAME:TAG OUT.tar [ENTRYPOINT...]: a one-layer `docker save` archive of ROOTFS for
`ctr images import` (no registry here: the node's images are built locally; see build_node.sh). Deterministic
layer (sorted walk, uid/gid 0, mtime 0)."""
import hashlib
import io
import json
import os
import sys
import tarfile

rootfs, ref, out, entry = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
buf = io.BytesIO()
with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
    for dp, dns, fns in os.walk(rootfs):
        dns.sort()
        for n in sorted(dns) + sorted(fns):
            p = os.path.join(dp, n)
            ti = t.gettarinfo(p, arcname=os.path.relpath(p, rootfs))
            ti.uid = ti.gid = 0
            ti.uname = ti.gname = ""
            ti.mtime = 0
            if ti.isfile():
                with open(p, "rb") as f:
                    t.addfile(ti, f)
            else:
                t.addfile(ti)
layer = buf.getvalue()
lsha = hashlib.sha256(layer).hexdigest()
cfg = {"architecture": "amd64", "os": "linux", "created": "1970-01-01T00:00:00Z",
       "config": {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
                  "Entrypoint": entry or None},
       "rootfs": {"type": "layers", "diff_ids": ["sha256:" + lsha]}}
cb = json.dumps(cfg, sort_keys=True).encode()
csha = hashlib.sha256(cb).hexdigest()
manifest = json.dumps([{"Config": csha + ".json", "RepoTags": [ref], "Layers": [lsha + "/layer.tar"]}]).encode()
with tarfile.open(out, "w") as t:
    for name, data in [(csha + ".json", cb), (lsha + "/layer.tar", layer), ("manifest.json", manifest)]:
        ti = tarfile.TarInfo(name)
        ti.size = len(data)
        t.addfile(ti, io.BytesIO(data))
print(out, ref, len(layer), "bytes", file=sys.stderr)
