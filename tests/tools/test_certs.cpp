#include "tests/tools/test_certs.hpp"

#include "tests/tools/child_process.hpp"

#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace rmmd::test {
namespace {

void openssl(std::vector<std::string> args)
{
  args.insert(args.begin(), "/usr/bin/openssl");
  auto r = run(args, 60s);
  if (r.status != 0) {
    std::string line;
    for (auto const& a : args) { line += a + " "; }
    throw std::runtime_error("openssl failed (" + std::to_string(r.status) + "): " + line);
  }
}

void write(std::filesystem::path const& path, std::string const& text)
{
  std::ofstream(path) << text;
}

/// An EC key and a self-signed CA certificate.
void make_ca(std::filesystem::path const& dir, std::string const& name, std::string const& cn)
{
  openssl({"req",
           "-x509",
           "-newkey",
           "ec",
           "-pkeyopt",
           "ec_paramgen_curve:prime256v1",
           "-nodes",
           "-keyout",
           (dir / (name + ".key")).string(),
           "-out",
           (dir / (name + ".pem")).string(),
           "-days",
           "2",
           "-subj",
           "/CN=" + cn});
}

void make_signed(std::filesystem::path const& dir,
                 std::string const& name,
                 std::string const& ca,
                 std::string const& cn)
{
  auto const key = (dir / (name + ".key")).string();
  auto const csr = (dir / (name + ".csr")).string();
  openssl({"req",
           "-newkey",
           "ec",
           "-pkeyopt",
           "ec_paramgen_curve:prime256v1",
           "-nodes",
           "-keyout",
           key,
           "-out",
           csr,
           "-subj",
           "/CN=" + cn});
  openssl({"x509",
           "-req",
           "-in",
           csr,
           "-CA",
           (dir / (ca + ".pem")).string(),
           "-CAkey",
           (dir / (ca + ".key")).string(),
           "-CAcreateserial",
           "-out",
           (dir / (name + ".pem")).string(),
           "-days",
           "2",
           "-extfile",
           (dir / "san.cnf").string()});
}

}  // namespace

void make_test_certs(std::filesystem::path const& dir)
{
  write(dir / "san.cnf", "subjectAltName=DNS:localhost,IP:127.0.0.1\n");
  make_ca(dir, "ca", "rmmd-test-ca");
  make_ca(dir, "other-ca", "rmmd-other-ca");
  make_signed(dir, "nodeA", "ca", "rmmd-nodeA");
  make_signed(dir, "nodeB", "ca", "rmmd-nodeB");
  make_signed(dir, "nodeC", "ca", "rmmd-nodeC");
  make_signed(dir, "stranger", "other-ca", "rmmd-stranger");
  // Expired: `openssl ca` can date a certificate in the past.
  auto const ca_dir = dir / "expired-ca";
  std::filesystem::create_directories(ca_dir / "new");
  write(ca_dir / "index.txt", "");
  write(ca_dir / "serial", "1000\n");
  write(ca_dir / "ca.cnf",
        "[ca]\ndefault_ca = test\n[test]\ndir = " + ca_dir.string() +
            "\ndatabase = $dir/index.txt\nserial = $dir/serial\nnew_certs_dir = $dir/new\n"
            "default_md = sha256\npolicy = any\ncopy_extensions = copy\n"
            "[any]\ncommonName = supplied\n");
  auto const csr = (dir / "expired.csr").string();
  openssl({"req",
           "-newkey",
           "ec",
           "-pkeyopt",
           "ec_paramgen_curve:prime256v1",
           "-nodes",
           "-keyout",
           (dir / "expired.key").string(),
           "-out",
           csr,
           "-subj",
           "/CN=rmmd-expired"});
  openssl({"ca",
           "-batch",
           "-notext",
           "-config",
           (ca_dir / "ca.cnf").string(),
           "-cert",
           (dir / "ca.pem").string(),
           "-keyfile",
           (dir / "ca.key").string(),
           "-in",
           csr,
           "-out",
           (dir / "expired.pem").string(),
           "-startdate",
           "20200101000000Z",
           "-enddate",
           "20200102000000Z"});
}

}  // namespace rmmd::test
