// Takes part in an election with Apache Curator's LeaderLatch on a path, driven line by line.
//
//   java -cp <curator and zookeeper jars> Latch.java <connect string> <latch path> <participant id>
//
// Prints "STARTED" once the latch is started, "LEADING" / "NOT LEADING" when its leadership
// changes (LeaderLatchListener), and answers commands read from stdin, one a line:
//   has    -> "HAS true" or "HAS false" (hasLeadership())
//   leader -> "LEADER <id>" (getLeader().getId(): the leader node's data; empty if none)
//   close  -> closes the latch (its node is deleted), "CLOSED", exits 0.
// Exits 2 on bad arguments, 1 on any failure.
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.concurrent.TimeUnit;
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.leader.LeaderLatch;
import org.apache.curator.framework.recipes.leader.LeaderLatchListener;
import org.apache.curator.retry.RetryOneTime;

public class Latch {
    static synchronized void say(String line) {
        System.out.println(line);
        System.out.flush();
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 3) {
            System.err.println("usage: Latch <connect string> <latch path> <participant id>");
            System.exit(2);
        }
        try (CuratorFramework client =
                CuratorFrameworkFactory.newClient(args[0], 30000, 10000, new RetryOneTime(200))) {
            client.start();
            if (!client.blockUntilConnected(20, TimeUnit.SECONDS)) {
                throw new IllegalStateException("no connection to " + args[0]);
            }
            LeaderLatch latch = new LeaderLatch(client, args[1], args[2]);
            latch.addListener(new LeaderLatchListener() {
                @Override
                public void isLeader() {
                    say("LEADING");
                }

                @Override
                public void notLeader() {
                    say("NOT LEADING");
                }
            });
            latch.start();
            say("STARTED");
            BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
            String line;
            while ((line = in.readLine()) != null) {
                switch (line.trim()) {
                    case "has":
                        say("HAS " + latch.hasLeadership());
                        break;
                    case "leader":
                        say("LEADER " + latch.getLeader().getId());
                        break;
                    case "close":
                        latch.close();
                        say("CLOSED");
                        return;
                    default:
                        System.err.println("unknown command: " + line);
                }
            }
            latch.close();
        } catch (Exception e) {
            e.printStackTrace();
            System.exit(1);
        }
    }
}
