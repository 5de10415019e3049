#include "service/metrics/metrics_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/metrics/metrics.h"

namespace gradcomp::service {
namespace {

using ::testing::HasSubstr;

// A plain HTTP/1.0 GET over a socket: enough for one scrape, no client lib.
std::string HttpGet(int port, const std::string& path) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "";
  }
  const std::string request = "GET " + path + " HTTP/1.0\r\n\r\n";
  if (write(fd, request.data(), request.size()) < 0) {
    close(fd);
    return "";
  }
  std::string response;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) response.append(buf, n);
  close(fd);
  return response;
}

TEST(MetricsServerTest, ServesTheMetricsOverHttp) {
  Metrics metrics(nullptr, "9.9.9");
  metrics.CountReduce("none", absl::StatusCode::kOk);
  auto exposer = StartMetricsServer("127.0.0.1:0", metrics.collectable());
  ASSERT_TRUE(exposer.ok()) << exposer.status();
  ASSERT_EQ((*exposer)->GetListeningPorts().size(), 1u);
  const std::string body =
      HttpGet((*exposer)->GetListeningPorts()[0], "/metrics");
  EXPECT_THAT(body, HasSubstr("200 OK"));
  EXPECT_THAT(body,
              HasSubstr("gradcomp_reduce_total{code=\"OK\",codec=\"none\"} 1"));
  EXPECT_THAT(body, HasSubstr("gradcomp_build_info{version=\"9.9.9\""));
}

TEST(MetricsServerTest, BusyAddressIsAClearError) {
  Metrics metrics(nullptr, "9.9.9");
  auto first = StartMetricsServer("127.0.0.1:0", metrics.collectable());
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string taken =
      "127.0.0.1:" + std::to_string((*first)->GetListeningPorts()[0]);
  auto second = StartMetricsServer(taken, metrics.collectable());
  ASSERT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(second.status().message(), HasSubstr(taken));
}

}  // namespace
}  // namespace gradcomp::service
