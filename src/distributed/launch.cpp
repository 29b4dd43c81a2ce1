#include "distributed/launch.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace coconut {

namespace {

// A TCP port that is free now on the loopback interface (the kernel's pick).
int free_loopback_port() {
  const int handle = socket(AF_INET, SOCK_STREAM, 0);
  if (handle < 0) throw std::runtime_error(std::string("launch: socket: ") + std::strerror(errno));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof address;
  if (bind(handle, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      getsockname(handle, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    close(handle);
    throw std::runtime_error(std::string("launch: no free port on 127.0.0.1: ") + std::strerror(errno));
  }
  close(handle);
  return ntohs(address.sin_port);
}

int exit_status(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

}  // namespace

int launch_local_processes(int processes, const std::vector<std::string>& arguments) {
  if (processes < 1) throw std::invalid_argument("--nproc must be at least 1");
  if (std::getenv("WORLD_SIZE") != nullptr)
    throw std::invalid_argument("--nproc starts its own processes; do not combine it with WORLD_SIZE/RANK set by a launcher");
  const char* port_text = std::getenv("MASTER_PORT");
  const int port = port_text != nullptr ? std::atoi(port_text) : free_loopback_port();
  const unsigned cpus = std::max(1u, std::thread::hardware_concurrency());
  const bool threads_set = std::getenv("OMP_NUM_THREADS") != nullptr;

  std::vector<std::string> inherited;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string text = *entry;
    const std::string key = text.substr(0, text.find('='));
    if (key != "RANK" && key != "LOCAL_RANK" && key != "WORLD_SIZE" && key != "MASTER_ADDR" && key != "MASTER_PORT")
      inherited.push_back(text);
  }
  std::vector<pid_t> children;
  for (int rank = 0; rank < processes; ++rank) {
    std::vector<std::string> environment = inherited;
    environment.push_back("RANK=" + std::to_string(rank));
    environment.push_back("LOCAL_RANK=" + std::to_string(rank));
    environment.push_back("WORLD_SIZE=" + std::to_string(processes));
    environment.push_back("MASTER_ADDR=127.0.0.1");
    environment.push_back("MASTER_PORT=" + std::to_string(port));
    if (!threads_set) environment.push_back("OMP_NUM_THREADS=" + std::to_string(std::max(1u, cpus / static_cast<unsigned>(processes))));
    std::vector<char*> envp, argv;
    for (auto& entry : environment) envp.push_back(entry.data());
    envp.push_back(nullptr);
    std::string program = "/proc/self/exe";
    argv.push_back(program.data());
    std::vector<std::string> copies = arguments;
    for (auto& argument : copies) argv.push_back(argument.data());
    argv.push_back(nullptr);
    pid_t child = 0;
    const int error = posix_spawn(&child, "/proc/self/exe", nullptr, nullptr, argv.data(), envp.data());
    if (error != 0) {
      for (pid_t started : children) kill(started, SIGTERM);
      throw std::runtime_error(std::string("launch: cannot start rank ") + std::to_string(rank) + ": " + std::strerror(error));
    }
    children.push_back(child);
  }
  int result = 0;
  size_t running = children.size();
  while (running > 0) {
    int status = 0;
    const pid_t done = waitpid(-1, &status, 0);
    if (done < 0) break;
    bool ours = false;
    for (auto& child : children)
      if (child == done) {
        child = -1;
        ours = true;
      }
    if (!ours) continue;
    --running;
    const int code = exit_status(status);
    if (code != 0 && result == 0) {
      result = code;
      for (pid_t child : children)
        if (child > 0) kill(child, SIGTERM);
    }
  }
  return result;
}

}  // namespace coconut
