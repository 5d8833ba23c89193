// Certificates for TLS tests, made with openssl in a directory the test owns.
import { execFileSync } from "node:child_process";
import { writeFileSync } from "node:fs";
import path from "node:path";

const openssl = (dir: string, ...args: string[]) => execFileSync("openssl", args, { stdio: "ignore", cwd: dir });

/**
 * A self-signed certificate for `cn` (and `san`, as openssl spells it: "IP:127.0.0.2"):
 * <dir>/<name>.pem and its key <dir>/<name>.key.
 */
export function selfSigned(dir: string, name: string, cn: string, san?: string): { cert: string; key: string } {
  const key = path.join(dir, `${name}.key`);
  const cert = path.join(dir, `${name}.pem`);
  openssl(
    dir,
    "req",
    "-x509",
    "-newkey",
    "rsa:2048",
    "-nodes",
    "-days",
    "2",
    "-subj",
    `/CN=${cn}`,
    ...(san ? ["-addext", `subjectAltName=${san}`] : []),
    "-keyout",
    key,
    "-out",
    cert,
  );
  return { cert, key };
}

/**
 * A CA (<name>-ca.pem, <name>-ca.key) and a server certificate it signed for 127.0.0.1 and
 * localhost (<name>.pem, <name>.key).
 */
export function caAndServer(dir: string, name: string): void {
  selfSigned(dir, `${name}-ca`, `${name} test CA`);
  writeFileSync(path.join(dir, "san.cnf"), "subjectAltName=IP:127.0.0.1,DNS:localhost\n");
  openssl(
    dir,
    "req",
    "-newkey",
    "rsa:2048",
    "-nodes",
    "-subj",
    "/CN=127.0.0.1",
    "-keyout",
    `${name}.key`,
    "-out",
    `${name}.csr`,
  );
  openssl(
    dir,
    "x509",
    "-req",
    "-in",
    `${name}.csr`,
    "-CA",
    `${name}-ca.pem`,
    "-CAkey",
    `${name}-ca.key`,
    "-CAcreateserial",
    "-days",
    "2",
    "-extfile",
    "san.cnf",
    "-out",
    `${name}.pem`,
  );
}
