#include "service/transport/test_certificates.h"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"

namespace gradcomp::service {
namespace {

constexpr char kKeyType[] = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1";

// Runs `command` through the shell; its output goes to `log`, which an
// error quotes.
absl::Status Run(const std::string& command, const std::string& log) {
  const int status =
      std::system(absl::StrCat(command, " >", log, " 2>&1").c_str());
  if (status == 0) return absl::OkStatus();
  std::ifstream in(log);
  std::stringstream output;
  output << in.rdbuf();
  return absl::InternalError(absl::StrCat("'", command, "' failed (status ",
                                          status, "): ", output.str()));
}

}  // namespace

TestCa::TestCa(std::string dir, std::string name)
    : dir_(std::move(dir)),
      name_(std::move(name)),
      cert_(absl::StrCat(dir_, "/", name_, ".crt")),
      key_(absl::StrCat(dir_, "/", name_, ".key")) {}

absl::StatusOr<TestCa> TestCa::Create(const std::string& dir,
                                      const std::string& name) {
  TestCa ca(dir, name);
  absl::Status made = Run(
      absl::StrCat("openssl req -x509 ", kKeyType,
                   " -nodes -days 2 -subj "
                   "'/CN=",
                   name, "' -addext 'basicConstraints=critical,CA:TRUE' ",
                   "-addext 'keyUsage=critical,keyCertSign,cRLSign' -keyout '",
                   ca.key_, "' -out '", ca.cert_, "'"),
      absl::StrCat(dir, "/", name, ".log"));
  if (!made.ok()) return made;
  return ca;
}

absl::StatusOr<PeerTlsFiles> TestCa::Issue(const std::string& leaf,
                                           const std::string& names) {
  const std::string base = absl::StrCat(dir_, "/", leaf);
  const std::string log = base + ".log";
  PeerTlsFiles files;
  files.cert = base + ".crt";
  files.key = base + ".key";
  files.ca = cert_;
  {
    std::ofstream ext(base + ".ext");
    ext << "subjectAltName=" << names
        << "\nextendedKeyUsage=serverAuth,clientAuth\n";
  }
  absl::Status made = Run(
      absl::StrCat("openssl req -new ", kKeyType, " -nodes -subj '/CN=", leaf,
                   "' -keyout '", files.key, "' -out '", base, ".csr'"),
      log);
  if (!made.ok()) return made;
  made =
      Run(absl::StrCat("openssl x509 -req -days 2 -in '", base, ".csr' -CA '",
                       cert_, "' -CAkey '", key_, "' -set_serial ", ++serial_,
                       " -extfile '", base, ".ext' -out '", files.cert, "'"),
          log);
  if (!made.ok()) return made;
  return files;
}

}  // namespace gradcomp::service
