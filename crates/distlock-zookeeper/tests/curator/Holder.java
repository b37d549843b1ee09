// Takes Apache Curator's InterProcessMutex on a path, says so, holds it, releases it.
//
//   java -cp <curator and zookeeper jars> Holder.java <connect string> <lock path> <hold ms>
//
// Prints one line per step on stdout ("WAITING", "ACQUIRED", "RELEASED") so that a test can
// follow it; exits 0 after the release, 2 on bad arguments, 1 on any failure.
import java.util.concurrent.TimeUnit;
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.retry.RetryOneTime;

public class Holder {
    public static void main(String[] args) throws Exception {
        if (args.length != 3) {
            System.err.println("usage: Holder <connect string> <lock path> <hold ms>");
            System.exit(2);
        }
        long holdMs = Long.parseLong(args[2]);
        try (CuratorFramework client =
                CuratorFrameworkFactory.newClient(args[0], 30000, 10000, new RetryOneTime(200))) {
            client.start();
            if (!client.blockUntilConnected(20, TimeUnit.SECONDS)) {
                throw new IllegalStateException("no connection to " + args[0]);
            }
            InterProcessMutex mutex = new InterProcessMutex(client, args[1]);
            System.out.println("WAITING");
            System.out.flush();
            mutex.acquire();
            System.out.println("ACQUIRED");
            System.out.flush();
            Thread.sleep(holdMs);
            mutex.release();
            System.out.println("RELEASED");
            System.out.flush();
        } catch (Exception e) {
            e.printStackTrace();
            System.exit(1);
        }
    }
}
